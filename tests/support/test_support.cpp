#include "tests/support/test_support.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>

#include "base/file_util.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/safetensors.hpp"
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
                                                 uint64_t seed, int64_t step, const nlohmann::json& model,
                                                 const std::vector<std::string>& states) {
  const ckpt::Layout layout(table, spec);
  const std::filesystem::path step_dir = run_dir / ckpt::step_dir_name(step);
  ckpt::prepare_step_dir(step_dir);
  const std::string uid = ckpt::make_checkpoint_uid();
  ckpt::CheckpointMeta meta;
  meta.step = step;
  meta.table = &table;
  meta.layout = spec;
  meta.states = states;
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
  ckpt::commit_checkpoint(step_dir, ckpt::build_manifest(meta, uid, std::move(records)), true, options.durable);
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

std::vector<std::string> fixture_folders(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (std::filesystem::exists(entry.path() / "expected.json")) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void expect_states_equal_bitwise(ckpt::CheckpointReader& reader, const std::filesystem::path& expected_file) {
  const ckpt::safetensors::Reader expected(expected_file);
  // Every state the file has (fp32 and the optimizer's moments: AdamW's two or Lion's one), and no other
  // in the checkpoint.
  std::set<std::string> states;
  for (const ckpt::safetensors::TensorInfo& info : expected.header().tensors) {
    states.insert(info.name.substr(0, info.name.find('/')));
  }
  const std::vector<std::string>& held = reader.manifest().states;
  EXPECT_EQ(std::set<std::string>(held.begin(), held.end()), states) << "the states of " << expected_file;
  for (const std::string& state : states) {
    const int s = reader.find_state(state);
    ASSERT_GE(s, 0) << state;
    for (size_t t = 0; t < reader.tensors().size(); ++t) {
      const ckpt::TensorInfo& tensor = reader.tensors()[t];
      const ckpt::safetensors::TensorInfo* info = expected.header().find(std::string(state) + "/" + tensor.name);
      ASSERT_NE(info, nullptr) << state << "/" << tensor.name << " is not in " << expected_file;
      ASSERT_EQ(info->dtype, "F32");
      ASSERT_EQ(info->shape, tensor.shape) << tensor.name;
      std::vector<uint32_t> want(static_cast<size_t>(tensor.numel()));
      expected.read(*info, 0, std::as_writable_bytes(std::span<uint32_t>(want)));
      std::vector<float> values(want.size());
      reader.read(static_cast<int>(t), s, 0, values);
      std::vector<uint32_t> got(values.size());
      std::memcpy(got.data(), values.data(), values.size() * sizeof(float));
      // Bit patterns: an import must not round, flush or reorder a single element.
      const auto first = static_cast<size_t>(std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin());
      EXPECT_EQ(first, got.size()) << state << " " << tensor.name << " differs first at element " << first << " of "
                                   << got.size();
    }
  }
}

}  // namespace shardkit::testing
