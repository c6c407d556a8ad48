// `shardkit bench ckpt`: times the durable write of a synthetic sharded checkpoint through the same
// save protocol and shard writer the trainer uses. Collective: every rank writes its share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "ckpt/collective.hpp"
#include "ckpt/shard_writer.hpp"

namespace shardkit::ckpt {

struct SaveBenchOptions {
  int64_t bytes = int64_t{1} << 30;  // payload of the whole checkpoint (3 fp32 states)
  std::filesystem::path dir;
  int stage = 1;
  int repeat = 1;
  uint64_t seed = 1234;
  ShardOptions shard;
  // Called on every rank after each checkpoint with (payload bytes written, payload bytes of all repeats).
  std::function<void(int64_t done, int64_t total)> progress;
};

struct SaveBenchResult {
  int64_t bytes = 0;                // shard files of one checkpoint, all ranks
  double seconds = 0;               // median over repeats, from the start of the save to its commit
  std::vector<double> all_seconds;  // every repeat
  bool durable = true;
  std::filesystem::path last_checkpoint;
  double gb_per_s() const noexcept { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

// Writes `repeat` checkpoints into `dir` (steps after the newest one there) and keeps the last.
SaveBenchResult run_save_bench(Collective& group, const SaveBenchOptions& options);

struct ChecksumBenchResult {
  int64_t bytes = 0;
  double xxh64_gb_per_s = 0;   // one core, best of several passes
  double memcpy_gb_per_s = 0;  // one core, for scale
};

// Hashes and copies a buffer of `bytes` in several timed passes; `progress`, if set, is called after each
// pass with (bytes hashed, bytes to hash in all passes).
ChecksumBenchResult run_checksum_bench(int64_t bytes,
                                       const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace shardkit::ckpt
