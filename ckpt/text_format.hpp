// Numbers written for people: byte sizes and counts with thousands separators. Shared by the command
// line's console output and the HTML report, so that both print the same figure the same way.
#pragma once

#include <cstdint>
#include <string>

namespace shardkit::ckpt {

// 1234567 -> "1.23 MB" (decimal units, two decimals past bytes).
std::string format_bytes(double bytes);
// 1234567 -> "1,234,567".
std::string format_count(int64_t value);

}  // namespace shardkit::ckpt
