#include "base/text_format.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <exception>

#include "base/error.hpp"

namespace shardkit {

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

int64_t parse_size(std::string_view text, std::string_view option) {
  const std::string s(text);
  auto bad = [&]() -> int64_t {
    fail(ErrorKind::kInvalidInput,
         std::string(option) + ": '" + s + "' is not a size (examples: 4096, 64MiB, 1GiB, 5GB)");
  };
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(s, &used);
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit = s.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kb")
    scale = 1e3;
  else if (unit == "m" || unit == "mb")
    scale = 1e6;
  else if (unit == "g" || unit == "gb")
    scale = 1e9;
  else if (unit == "t" || unit == "tb")
    scale = 1e12;
  else if (unit == "kib")
    scale = 1024.0;
  else if (unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return bad();
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 9.0e18) return bad();
  return static_cast<int64_t>(std::llround(bytes));
}

namespace {

// Length of the valid UTF-8 sequence at the start of `text` (1 to 4) and its code point; 0 when the
// bytes there are not one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF).
size_t utf8_sequence(std::string_view text, char32_t& code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  // The allowed range of the second byte narrows for E0, ED, F0 and F4 (RFC 3629's table).
  unsigned char low = 0x80, high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    code_point = lead & 0x1f;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    code_point = lead & 0x0f;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i) & 0x3f);
  }
  return length;
}

// Code points above U+007F that a terminal or an editor acts on instead of showing.
bool is_format_control(char32_t c) {
  return (c >= 0x80 && c <= 0x9f) ||      // C1 controls (0x9b is a CSI on some terminals)
         c == 0x200e || c == 0x200f ||    // left-to-right and right-to-left marks
         (c >= 0x2028 && c <= 0x202e) ||  // line and paragraph separators, bidirectional embeddings
         (c >= 0x2066 && c <= 0x2069);    // bidirectional isolates
}

void append_escaped(std::string& out, std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 0x0f];
  }
}

}  // namespace

std::string escape_control(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b >= 0x20 && b < 0x7f) {
      out += text[i++];
      continue;
    }
    if (b < 0x80) {
      append_escaped(out, text.substr(i++, 1));
      continue;
    }
    char32_t code_point = 0;
    const size_t length = utf8_sequence(text.substr(i), code_point);
    if (length == 0) {
      append_escaped(out, text.substr(i++, 1));
      continue;
    }
    if (is_format_control(code_point)) {
      append_escaped(out, text.substr(i, length));
    } else {
      out += text.substr(i, length);
    }
    i += length;
  }
  return out;
}

void print_line(std::FILE* to, const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list measure;
  va_copy(measure, args);
  const int length = std::vsnprintf(nullptr, 0, format, measure);
  va_end(measure);
  std::string text(static_cast<size_t>(std::max(length, 0)), '\0');
  std::vsnprintf(text.data(), text.size() + 1, format, args);
  va_end(args);
  const std::string line = escape_control(text) + '\n';
  std::fwrite(line.data(), 1, line.size(), to);
}

}  // namespace shardkit
