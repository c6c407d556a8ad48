#include "base/xxh64.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace shardkit::ckpt {
namespace {

// Reference values from Python's xxhash package (xxhash.xxh64(data, seed).intdigest()).
TEST(Xxh64, MatchesReferenceVectors) {
  EXPECT_EQ(xxh64("", 0), 0xef46db3751d8e999ULL);
  EXPECT_EQ(xxh64("a", 1), 0xd24ec4f1a98c6e5bULL);
  EXPECT_EQ(xxh64("abc", 3), 0x44bc2cf5ad770999ULL);
  EXPECT_EQ(xxh64("abc", 3, 12345), 0x1700e64f6f23509ULL);
  std::string bytes;
  for (int i = 0; i < 5; ++i)
    for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  EXPECT_EQ(xxh64(bytes.data(), bytes.size()), 0xafc184ad7938a354ULL);
  EXPECT_EQ(xxh64(bytes.data(), bytes.size(), 12345), 0x1262d0d8880182c3ULL);
  EXPECT_EQ(xxh64(std::string(31, 'x').data(), 31), 0x60dd0d01083b99f0ULL);
  EXPECT_EQ(xxh64(std::string(32, 'y').data(), 32), 0x64da1f1d3495ce66ULL);
  EXPECT_EQ(xxh64(std::string(33, 'z').data(), 33), 0xc5241253c64e0268ULL);
}

TEST(Xxh64, StreamingEqualsOneShotForAnySplit) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(5000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = rng() % data.size();
    Xxh64 h(trial);
    size_t pos = 0;
    while (pos < n) {
      const size_t step = std::min<size_t>(n - pos, rng() % 70);
      h.update(data.data() + pos, step);
      pos += step;
    }
    ASSERT_EQ(h.digest(), xxh64(data.data(), n, static_cast<uint64_t>(trial))) << "length " << n;
  }
}

TEST(Xxh64, DetectsEverySingleBitFlip) {
  std::vector<unsigned char> data(256, 0x5a);
  const uint64_t reference = xxh64(data.data(), data.size());
  for (size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(xxh64(data.data(), data.size()), reference) << "bit " << bit;
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
}

TEST(Hex, RoundTripsAndRejectsMalformedText) {
  uint64_t v = 0;
  EXPECT_EQ(to_hex(0x00ab00cd00ef0012ULL), "00ab00cd00ef0012");
  ASSERT_TRUE(from_hex("00ab00cd00ef0012", &v));
  EXPECT_EQ(v, 0x00ab00cd00ef0012ULL);
  EXPECT_FALSE(from_hex("00AB00CD00EF0012", &v));  // the manifest form is lower case
  EXPECT_FALSE(from_hex("abc", &v));
  EXPECT_FALSE(from_hex("00ab00cd00ef001g", &v));
}

}  // namespace
}  // namespace shardkit::ckpt
