#include "trainer/data.hpp"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <numbers>
#include <numeric>
#include <utility>

#include "ckpt/error.hpp"
#include "ckpt/file_util.hpp"

namespace shardkit::trainer {
namespace {

// Tokens are used in place from the mapping, so the file's little-endian uint16 must be the host's.
static_assert(std::endian::native == std::endian::little, "shardkit assumes a little-endian host");

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// Philox4x32 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9;  // golden ratio
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;  // 2^-53

// Where the tokens of a file lie, decided from its size and (for llm.c files) its header.
struct TokenExtent {
  int64_t offset = 0;  // bytes
  int64_t count = 0;   // tokens
  bool llmc = false;
};

std::string file_error_prefix(const std::filesystem::path& path) {
  return path.string() + ": ";
}

// Validates the llm.c header (int32 magic, version, token count) against the file size.
TokenExtent llmc_extent(const std::filesystem::path& path, const int32_t header[3], int64_t file_size) {
  if (header[1] != kLlmcVersion) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(path) + "llm.c token file version " + std::to_string(header[1]) +
                                       ", expected " + std::to_string(kLlmcVersion));
  }
  const int64_t count = header[2];
  if (count < 0) {
    fail(ErrorKind::kInvalidInput,
         file_error_prefix(path) + "llm.c header declares a negative token count " + std::to_string(count));
  }
  const int64_t needed = kLlmcHeaderBytes + 2 * count;
  if (needed > file_size) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(path) + "llm.c header declares " + std::to_string(count) +
                                       " tokens (" + std::to_string(needed) +
                                       " bytes with the header) but the file has " + std::to_string(file_size) +
                                       " bytes");
  }
  return {kLlmcHeaderBytes, count, true};
}

// Decides the format: llm.c when the file is long enough for the header and starts with its magic,
// otherwise a raw array of uint16 tokens.
TokenExtent token_extent(const ckpt::FileDescriptor& fd, int64_t file_size) {
  const std::filesystem::path& path = fd.path();
  TokenExtent extent;
  if (file_size >= kLlmcHeaderBytes) {
    int32_t header[3];
    fd.pread_exact(header, sizeof(header), 0);
    if (header[0] == kLlmcMagic) extent = llmc_extent(path, header, file_size);
  }
  if (!extent.llmc) {
    if (file_size % 2 != 0) {
      fail(ErrorKind::kInvalidInput, file_error_prefix(path) + "raw token file has an odd size of " +
                                         std::to_string(file_size) + " bytes (expected uint16 tokens)");
    }
    extent.count = file_size / 2;
  }
  // An llm.c file may declare zero tokens; it is as useless as an empty raw file.
  if (extent.count == 0) fail(ErrorKind::kInvalidInput, file_error_prefix(path) + "holds no tokens");
  return extent;
}

// One Philox round: two 32x32 -> 64-bit products, their halves mixed with the other words and the key.
void philox_round(uint32_t c[4], const uint32_t k[2]) noexcept {
  const uint64_t product0 = uint64_t{kPhiloxMultiplier0} * c[0];
  const uint64_t product1 = uint64_t{kPhiloxMultiplier1} * c[2];
  const uint32_t c1 = c[1], c3 = c[3];
  c[0] = static_cast<uint32_t>(product1 >> 32) ^ c1 ^ k[0];
  c[1] = static_cast<uint32_t>(product1);
  c[2] = static_cast<uint32_t>(product0 >> 32) ^ c3 ^ k[1];
  c[3] = static_cast<uint32_t>(product0);
}

uint64_t join(uint32_t high, uint32_t low) noexcept {
  return (uint64_t{high} << 32) | low;
}

// 53 random bits of (high, low) as a double in [0, 1).
double unit_interval(uint32_t high, uint32_t low) noexcept {
  return static_cast<double>(join(high, low) >> 11) * kTwoPowMinus53;
}

}  // namespace

// ---- TokenFile -----------------------------------------------------------------------------------

TokenFile::TokenFile(const std::filesystem::path& path) : path_(path) {
  const ckpt::FileDescriptor fd = ckpt::open_input_file(path);
  const int64_t file_size = fd.size();
  // Every check happens before the mapping exists, so nothing can throw while it would leak.
  const TokenExtent extent = token_extent(fd, file_size);
  map_size_ = static_cast<size_t>(file_size);
  void* map = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) fail_errno(path.string() + ": mmap", errno);
  map_ = map;
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + extent.offset);
  count_ = extent.count;
  llmc_ = extent.llmc;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

// ---- SampleOrder ---------------------------------------------------------------------------------

SampleOrder::SampleOrder(const TokenFile& file, int seq_len, uint64_t seed)
    : file_(file), seq_len_(seq_len), seed_(seed), num_samples_(0) {
  if (seq_len < 1) {
    fail(ErrorKind::kInvalidInput,
         file_error_prefix(file.path()) + "sequence length " + std::to_string(seq_len) + " must be positive");
  }
  // Windows start every T tokens and each needs T + 1 (its last target is the next window's first input).
  num_samples_ = (file.size() - 1) / seq_len;
  if (num_samples_ == 0) {
    fail(ErrorKind::kInvalidInput, file_error_prefix(file.path()) + std::to_string(file.size()) +
                                       " tokens, fewer than the seq_len + 1 = " + std::to_string(seq_len + 1) +
                                       " of one sample");
  }
}

int64_t SampleOrder::sample_at(int64_t g) {
  if (g < 0) fail(ErrorKind::kInternal, "global sample index " + std::to_string(g) + " is negative");
  const int64_t epoch = g / num_samples_;
  if (epoch != cached_epoch_) {
    // Fisher-Yates from the last position down; step i draws its swap partner from counter (i, epoch),
    // so the permutation depends on (seed, epoch) only, not on which epochs were built before.
    permutation_.resize(static_cast<size_t>(num_samples_));
    std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
    for (int64_t i = num_samples_ - 1; i > 0; --i) {
      uint32_t out[4];
      Philox::generate(seed_, static_cast<uint64_t>(i), static_cast<uint64_t>(epoch), out);
      // Modulo of 64 random bits: the bias is below (i + 1) / 2^64, far beneath any observable effect.
      const auto j = static_cast<int64_t>(join(out[1], out[0]) % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[static_cast<size_t>(i)], permutation_[static_cast<size_t>(j)]);
    }
    cached_epoch_ = epoch;
  }
  return permutation_[static_cast<size_t>(g % num_samples_)];
}

void SampleOrder::fill(int64_t g, int vocab_size, int32_t* inputs, int32_t* targets) {
  const int64_t start = sample_at(g) * seq_len_;
  const uint16_t* window = file_.tokens() + start;  // (T + 1) tokens
  for (int64_t t = 0; t <= seq_len_; ++t) {
    if (window[t] >= vocab_size) {
      fail(ErrorKind::kInvalidInput, file_error_prefix(file_.path()) + "token id " + std::to_string(window[t]) +
                                         " at position " + std::to_string(start + t) +
                                         " is outside the vocabulary of " + std::to_string(vocab_size) + " tokens");
    }
  }
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = window[t];
    targets[t] = window[t + 1];
  }
}

// ---- Philox --------------------------------------------------------------------------------------

void Philox::generate(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, uint32_t out[4]) noexcept {
  uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  out[0] = static_cast<uint32_t>(counter_lo);
  out[1] = static_cast<uint32_t>(counter_lo >> 32);
  out[2] = static_cast<uint32_t>(counter_hi);
  out[3] = static_cast<uint32_t>(counter_hi >> 32);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {  // the first round uses the key itself; each later one bumps it by the Weyl constants
      k[0] += kPhiloxWeyl0;
      k[1] += kPhiloxWeyl1;
    }
    philox_round(out, k);
  }
}

double Philox::uniform(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) noexcept {
  uint32_t out[4];
  generate(key, counter_lo, counter_hi, out);
  return unit_interval(out[1], out[0]);
}

float Philox::normal(uint64_t key, uint64_t counter_lo, uint64_t counter_hi) noexcept {
  uint32_t out[4];
  generate(key, counter_lo, counter_hi, out);
  // u1 in (0, 1] keeps log(u1) finite; u2 in [0, 1) sets the angle. The sine partner is dropped so that
  // the value stays a function of (key, counter) alone.
  const double u1 = 1.0 - unit_interval(out[1], out[0]);
  const double u2 = unit_interval(out[3], out[2]);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace shardkit::trainer
