// Mutations of real shard files, opened and read as a resume would: every input must give a reader
// or an Error, never a crash, hang, out-of-bounds access or overflow in this process. libhdf5 parses
// the metadata in an isolated child (ckpt/isolated_process.hpp); its crashes and loops must come back
// as errors. The seeds are shards written by ShardWriter (raw and zstd), made at start-up into the
// folder named by SHARDKIT_FUZZ_SEEDS (scripts/fuzz.sh passes the corpus folder), so no binary seed is
// kept in the repository.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "ckpt/isolated_process.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/shard_reader.hpp"
#include "ckpt/shard_writer.hpp"
#include "fuzz/scratch.hpp"

namespace {

using namespace shardkit;

const std::vector<std::string> kStates = ckpt::adamw_state_names();
constexpr char kUid[] = "fuzz-checkpoint";
constexpr int64_t kStep = 7;
constexpr int64_t kChunkElems = 64;

struct Target {
  ckpt::TensorTable table{{{"emb", {40, 8}, ckpt::DType::kF32}, {"bias", {8}, ckpt::DType::kF32}}};
  ckpt::Layout layout{table, {2, 3, 16}};
  fuzz::Scratch input{"shard", ".h5"};
  uint64_t digest = 0;
};

Target& target() {
  static Target t;
  return t;
}

// Writes rank 1's shard of the target layout to `path`; returns its record.
ckpt::ShardRecord write_seed(const std::filesystem::path& path, int compression_level) {
  Target& t = target();
  ckpt::ShardOptions options;
  options.chunk_elems = kChunkElems;
  options.compression_level = compression_level;
  options.threads = 1;
  options.durable = false;
  ckpt::ShardWriter writer(path, t.table, t.layout, {kUid, kStep, 1}, kStates, options);
  std::vector<float> flat(static_cast<size_t>(t.layout.flat_size()));
  for (size_t s = 0; s < kStates.size(); ++s) {
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(s * 1000 + i) * 0.5f;
    writer.write_state(kStates[s], flat);
  }
  return writer.commit();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // A damaged shard's parse may loop: one second of CPU time each, not a minute.
  ckpt::isolated::restart_for_testing(1.0 / 60);
  Target& t = target();
  const std::filesystem::path scratch = t.input.path().string() + ".seed";
  std::filesystem::create_directories(scratch);
  t.digest = write_seed(scratch / "raw.h5", 0).digest;
  if (write_seed(scratch / "zstd.h5", 3).digest != t.digest) std::abort();
  if (const char* seeds = std::getenv("SHARDKIT_FUZZ_SEEDS")) {
    for (const char* name : {"raw.h5", "zstd.h5"}) {
      std::filesystem::copy_file(scratch / name, std::filesystem::path(seeds) / ("shard_" + std::string(name)),
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }
  std::filesystem::remove_all(scratch);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Target& t = target();
  {
    const int fd = ::open(t.input.path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  ckpt::ShardExpectation expect;
  expect.table = &t.table;
  expect.layout = &t.layout;
  expect.rank = 1;
  expect.checkpoint_uid = kUid;
  expect.step = kStep;
  expect.chunk_elems = kChunkElems;
  expect.states = kStates;
  expect.bytes = static_cast<int64_t>(size);  // the size check would stop most mutations before HDF5
  expect.digest = t.digest;
  try {
    ckpt::ShardReader reader(t.input.path(), expect);
    ckpt::ShardReader::Scratch scratch;
    for (size_t s = 0; s < reader.num_states(); ++s) {
      for (int64_t c = 0; c < reader.num_chunks(); ++c) reader.check_chunk(s, c, scratch);
    }
  } catch (const shardkit::Error&) {
  }
  return 0;
}
