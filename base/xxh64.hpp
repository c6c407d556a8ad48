// XXH64 (xxHash, 64-bit variant, as specified in the public xxHash specification), written from the
// specification. It covers every chunk of checkpoint data: fast enough (> 5 GB/s per core) never to
// be the bottleneck of a save, and readable by other tools (Python's `xxhash.xxh64`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace shardkit {

// One-shot XXH64 of `size` bytes at `data`.
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0) noexcept;

inline uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed = 0) noexcept {
  return xxh64(bytes.data(), bytes.size(), seed);
}

// Streaming XXH64: the digest of the concatenation of all update() calls equals the one-shot digest.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) noexcept;
  void update(const void* data, size_t size) noexcept;
  uint64_t digest() const noexcept;

 private:
  uint64_t acc_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buffer_[32];
  size_t buffered_ = 0;
};

// The 16-digit lower-case hexadecimal form used in manifests.
std::string to_hex(uint64_t value);
// Parses to_hex()'s form; returns false on anything else.
bool from_hex(const std::string& text, uint64_t* value) noexcept;

}  // namespace shardkit
