#include "base/xxh64.hpp"

#include <bit>
#include <cstring>

namespace shardkit {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

static_assert(std::endian::native == std::endian::little, "shardkit assumes a little-endian host");

inline uint64_t read64(const unsigned char* p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t read32(const unsigned char* p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t lane) noexcept {
  acc += lane * kPrime2;
  acc = std::rotl(acc, 31);
  return acc * kPrime1;
}

inline uint64_t merge(uint64_t acc, uint64_t lane_acc) noexcept {
  acc ^= round(0, lane_acc);
  return acc * kPrime1 + kPrime4;
}

inline void init_lanes(uint64_t acc[4], uint64_t seed) noexcept {
  acc[0] = seed + kPrime1 + kPrime2;
  acc[1] = seed + kPrime2;
  acc[2] = seed;
  acc[3] = seed - kPrime1;
}

// Consumes whole 32-byte stripes; returns the number of bytes consumed.
inline size_t consume_stripes(uint64_t acc[4], const unsigned char* p, size_t size) noexcept {
  const size_t n = size & ~size_t{31};
  uint64_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
  for (size_t i = 0; i < n; i += 32) {
    a0 = round(a0, read64(p + i));
    a1 = round(a1, read64(p + i + 8));
    a2 = round(a2, read64(p + i + 16));
    a3 = round(a3, read64(p + i + 24));
  }
  acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
  return n;
}

// Converges the lanes (or starts from seed + prime5 for short inputs), adds the length, consumes the
// tail of fewer than 32 bytes and mixes the result.
uint64_t finish(const uint64_t acc[4], bool had_stripes, uint64_t seed, uint64_t total, const unsigned char* tail,
                size_t tail_size) noexcept {
  uint64_t h;
  if (had_stripes) {
    h = std::rotl(acc[0], 1) + std::rotl(acc[1], 7) + std::rotl(acc[2], 12) + std::rotl(acc[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, acc[i]);
  } else {
    h = seed + kPrime5;
  }
  h += total;
  size_t i = 0;
  for (; i + 8 <= tail_size; i += 8) {
    h ^= round(0, read64(tail + i));
    h = std::rotl(h, 27) * kPrime1 + kPrime4;
  }
  if (i + 4 <= tail_size) {
    h ^= uint64_t{read32(tail + i)} * kPrime1;
    h = std::rotl(h, 23) * kPrime2 + kPrime3;
    i += 4;
  }
  for (; i < tail_size; ++i) {
    h ^= uint64_t{tail[i]} * kPrime5;
    h = std::rotl(h, 11) * kPrime1;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t xxh64(const void* data, size_t size, uint64_t seed) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t acc[4];
  init_lanes(acc, seed);
  const size_t done = consume_stripes(acc, p, size);
  return finish(acc, size >= 32, seed, size, p + done, size - done);
}

Xxh64::Xxh64(uint64_t seed) noexcept : seed_(seed) {
  init_lanes(acc_, seed);
}

void Xxh64::update(const void* data, size_t size) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ > 0) {
    const size_t take = std::min(size, sizeof(buffer_) - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < sizeof(buffer_)) return;
    consume_stripes(acc_, buffer_, sizeof(buffer_));
    buffered_ = 0;
  }
  const size_t done = consume_stripes(acc_, p, size);
  std::memcpy(buffer_, p + done, size - done);
  buffered_ = size - done;
}

uint64_t Xxh64::digest() const noexcept {
  return finish(acc_, total_ >= 32, seed_, total_, buffer_, buffered_);
}

std::string to_hex(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = kDigits[value & 0xF];
  return out;
}

bool from_hex(const std::string& text, uint64_t* value) noexcept {
  if (text.size() != 16) return false;
  uint64_t v = 0;
  for (char c : text) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *value = v;
  return true;
}

}  // namespace shardkit
