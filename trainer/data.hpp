// Token files and the order of training samples.
//
// A token file holds a flat array of token ids, 16 or 32 bits wide, in one of these formats:
//  - raw: little-endian uint16 ids and nothing else (nanoGPT's train.bin);
//  - llm.c: a header of 256 little-endian int32 (magic, version, token count, zeros) then the ids:
//    magic 20240520 version 1 for uint16 ids (GPT-2), magic 20240801 version 7 for uint32 (Llama 3);
//  - NumPy .npy (format 1.0, 2.0 or 3.0) of dtype '<u2' or '<u4', 1-D, or 2-D read flat in C order.
// The format is decided by the file's first bytes, never by its name: a file called train.bin that
// starts with the .npy magic is read as .npy, one at least as long as an llm.c header that starts with
// an llm.c magic as llm.c, anything else as raw. (A raw file whose first ids spell a magic is misread;
// for the .npy magic that takes the three ids 20115, 19797, 22864 in that order at the very start.)
// Files are memory-mapped; ids are widened to int32 only as a window is copied out of the mapping.
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
  enum class Format { kRaw, kLlmc, kNpy };

  // Maps the file; Error(kInvalidInput) naming the file for anything that is not one of the formats
  // above with at least one token: a missing, empty or odd-sized raw file, a bad llm.c header, a .npy
  // file with another dtype, order or rank, or whose header or shape does not fit the file.
  explicit TokenFile(const std::filesystem::path& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  Format format() const noexcept { return format_; }
  int64_t size() const noexcept { return count_; }                   // number of tokens
  int bytes_per_token() const noexcept { return bytes_per_token_; }  // 2 or 4
  // The id of token i, 0 <= i < size().
  uint32_t at(int64_t i) const noexcept;
  // Copies ids [first, first + count) into out[0..count) as int32. Throws Error(kInvalidInput)
  // naming the file and the position of the first id >= vocab_size (checked before narrowing, so a
  // 32-bit id can never wrap into a negative one), Error(kInternal) for a range outside the file.
  void read(int64_t first, int64_t count, int vocab_size, int32_t* out) const;

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* tokens_ = nullptr;
  int64_t count_ = 0;
  int bytes_per_token_ = 2;
  Format format_ = Format::kRaw;
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

}  // namespace shardkit::trainer
