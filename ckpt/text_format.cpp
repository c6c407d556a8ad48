#include "ckpt/text_format.hpp"

#include <cmath>
#include <cstdio>

namespace shardkit::ckpt {

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1000 && unit < 5) {
    bytes /= 1000;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[unit]);
  return buffer;
}

std::string format_count(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

}  // namespace shardkit::ckpt
