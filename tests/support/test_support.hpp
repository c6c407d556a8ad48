// Helpers shared by the test binaries: temporary directories, synthetic checkpoints written from one
// process, and tools to damage files in controlled ways.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/shard_writer.hpp"
#include "ckpt/tensor_table.hpp"

namespace shardkit::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// States used by the tests, as the trainer will write them.
const std::vector<std::string>& adam_states();

// Writes a committed checkpoint of synthetic values (ckpt::synthetic_value with `seed`) laid out by
// `spec`, writing every rank's shard from this process: `states` (default adam_states()). Returns the
// step directory.
std::filesystem::path write_synthetic_checkpoint(const std::filesystem::path& run_dir, const ckpt::TensorTable& table,
                                                 const ckpt::LayoutSpec& spec, const ckpt::ShardOptions& options,
                                                 uint64_t seed, int64_t step = 1,
                                                 const nlohmann::json& model = nlohmann::json::object(),
                                                 const std::vector<std::string>& states = adam_states());

// Where chunk `chunk` of /state/<state> lies in a shard file (byte offset and stored size).
struct ChunkExtent {
  int64_t offset = 0;
  int64_t size = 0;
};
ChunkExtent chunk_extent(const std::filesystem::path& shard, const std::string& state, int64_t chunk);

// Flips one bit of a file in place.
void flip_bit(const std::filesystem::path& file, int64_t offset, int bit = 0);

// A random tensor table: `count` tensors of 0-3 dimensions (at most one of them up to `max_dim`, the
// others below 8), including empty, scalar and tiny tensors.
ckpt::TensorTable random_table(uint64_t seed, int count, int64_t max_dim);

// The sub-folders of `dir` that hold an expected.json (fixtures a real tool wrote), sorted; empty when
// `dir` does not exist.
std::vector<std::string> fixture_folders(const std::filesystem::path& dir);

// Expects every tensor of `reader`'s fp32, exp_avg and exp_avg_sq states to equal, bit for bit, the
// F32 tensor `<state>/<name>` of `expected` (a safetensors file written beside a real tool's checkpoint).
void expect_states_equal_bitwise(ckpt::CheckpointReader& reader, const std::filesystem::path& expected);

}  // namespace shardkit::testing
