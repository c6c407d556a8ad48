#include "base/crc32c.hpp"

#include <gtest/gtest.h>

#include <string>

namespace shardkit {
namespace {

// The check values of CRC-32C (RFC 3720, appendix B.4, and the catalogue's "123456789").
TEST(Crc32c, MatchesPublishedCheckValues) {
  EXPECT_EQ(crc32c(""), 0x00000000u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
}

}  // namespace
}  // namespace shardkit
