// Token files and the order of training samples.
//
// A token file is a flat array of little-endian uint16 token ids (nanoGPT's train.bin), or llm.c's
// format: a header of 256 little-endian int32 (magic 20240520, version 1, token count) followed by
// the uint16 tokens. Files are memory-mapped.
//
// Samples are non-overlapping windows: sample s holds tokens [s*T, s*T + T + 1) (inputs are the first
// T, targets the last T). The order of samples is a function of the global sample index and the
// seed only: global index g is sample perm_e(g mod S) of epoch e = g div S, where perm_e is a
// pseudo-random permutation of [0, S) drawn from (seed, e). Any world size therefore sees the same
// global batches.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace shardkit::trainer {

class TokenFile {
 public:
  // Maps the file; Error(kInvalidInput) for a missing/empty/odd-sized file or a bad llm.c header.
  explicit TokenFile(const std::filesystem::path& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  int64_t size() const noexcept { return count_; }  // number of tokens
  const uint16_t* tokens() const noexcept { return tokens_; }
  bool llmc_format() const noexcept { return llmc_; }

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
  bool llmc_ = false;
};

class SampleOrder {
 public:
  // Windows of `seq_len` (+1) tokens over `file`; Error(kInvalidInput) when the file holds fewer than
  // seq_len + 1 tokens.
  SampleOrder(const TokenFile& file, int seq_len, uint64_t seed);

  int64_t num_samples() const noexcept { return num_samples_; }
  // The sample (window index) at global sample index `g` (g >= 0).
  int64_t sample_at(int64_t g);
  // Fills inputs[0..T) and targets[0..T) of global sample index `g` as int32 token ids. Throws
  // Error(kInvalidInput) naming the file and position when a token id is >= vocab_size.
  void fill(int64_t g, int vocab_size, int32_t* inputs, int32_t* targets);

 private:
  const TokenFile& file_;
  int seq_len_;
  uint64_t seed_;
  int64_t num_samples_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// Counter-based random numbers (Philox4x32-10): the same (key, counter) always gives the same
// output, so values can be drawn for any element independently and in any order.
struct Philox {
  // Four 32-bit outputs for a 128-bit counter under a 64-bit key.
  static void generate(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, uint32_t out[4]) noexcept;
  // A uniform double in [0, 1) from (key, counter_lo, counter_hi).
  static double uniform(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) noexcept;
  // A standard normal float from (key, counter_lo, counter_hi) (Box-Muller on one Philox block).
  static float normal(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) noexcept;
};

}  // namespace shardkit::trainer
