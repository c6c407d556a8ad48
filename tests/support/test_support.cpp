#include "tests/support/test_support.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <random>
#include <stdexcept>

#include "base/file_util.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/synthetic.hpp"

namespace shardkit::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "shardkit-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

const std::vector<std::string>& adam_states() {
  static const std::vector<std::string> states = {"fp32", "exp_avg", "exp_avg_sq"};
  return states;
}

std::filesystem::path write_synthetic_checkpoint(const std::filesystem::path& run_dir, const ckpt::TensorTable& table,
                                                 const ckpt::LayoutSpec& spec, const ckpt::ShardOptions& options,
                                                 uint64_t seed, int64_t step, const nlohmann::json& model) {
  const ckpt::Layout layout(table, spec);
  const std::filesystem::path step_dir = run_dir / ckpt::step_dir_name(step);
  ckpt::prepare_step_dir(step_dir);
  const std::string uid = ckpt::make_checkpoint_uid();
  ckpt::CheckpointMeta meta;
  meta.step = step;
  meta.table = &table;
  meta.layout = spec;
  meta.states = adam_states();
  meta.shard = options;
  meta.trainer_state = {{"step", step}};
  meta.model = model;
  std::vector<ckpt::ShardRecord> records;
  std::vector<float> flat(static_cast<size_t>(layout.flat_size()));
  for (int rank = 0; rank < spec.world_size; ++rank) {
    ckpt::ShardWriter writer(step_dir / ckpt::shard_file_name(rank, spec.world_size), table, layout, {uid, step, rank},
                             meta.states, options);
    for (size_t s = 0; s < meta.states.size(); ++s) {
      ckpt::fill_synthetic(layout, rank, seed, static_cast<int>(s), flat);
      writer.write_state(meta.states[s], flat);
    }
    records.push_back(writer.commit());
  }
  ckpt::commit_checkpoint(step_dir, ckpt::build_manifest(meta, uid, std::move(records)), true);
  return step_dir;
}

ChunkExtent chunk_extent(const std::filesystem::path& shard, const std::string& state, int64_t chunk) {
  ckpt::h5::Id file = ckpt::h5::open_file(shard);
  ckpt::h5::Id dataset = ckpt::h5::open_dataset(file.get(), ("state/" + state).c_str(), shard.string());
  ckpt::h5::Id dcpl(H5Dget_create_plist(dataset.get()));
  hsize_t chunk_dim = 0;
  H5Pget_chunk(dcpl.get(), 1, &chunk_dim);
  const hsize_t offset[1] = {static_cast<hsize_t>(chunk) * chunk_dim};
  unsigned mask = 0;
  haddr_t address = 0;
  hsize_t size = 0;
  if (H5Dget_chunk_info_by_coord(dataset.get(), offset, &mask, &address, &size) < 0) {
    throw std::runtime_error("no such chunk");
  }
  return {static_cast<int64_t>(address), static_cast<int64_t>(size)};
}

void flip_bit(const std::filesystem::path& file, int64_t offset, int bit) {
  FileDescriptor fd(file, O_RDWR);
  unsigned char byte = 0;
  fd.pread_exact(&byte, 1, offset);
  byte ^= static_cast<unsigned char>(1u << bit);
  if (::pwrite(fd.get(), &byte, 1, offset) != 1) throw std::runtime_error("pwrite failed");
  fd.close();
}

ckpt::TensorTable random_table(uint64_t seed, int count, int64_t max_dim) {
  std::mt19937_64 rng(seed);
  std::vector<ckpt::TensorInfo> tensors;
  for (int i = 0; i < count; ++i) {
    ckpt::TensorInfo t;
    t.name = "t" + std::to_string(i);
    const int rank = static_cast<int>(rng() % 4);
    const int big = static_cast<int>(rng() % 4);  // at most one dimension may be large
    for (int d = 0; d < rank; ++d) {
      // Mostly small dimensions, some zero, one occasionally up to max_dim.
      const uint64_t kind = rng() % 10;
      t.shape.push_back(kind == 0              ? 0
                        : d != big || kind < 5 ? static_cast<int64_t>(1 + rng() % 7)
                                               : static_cast<int64_t>(1 + rng() % static_cast<uint64_t>(max_dim)));
    }
    tensors.push_back(std::move(t));
  }
  return ckpt::TensorTable(std::move(tensors));
}

}  // namespace shardkit::testing
