#include "trainer/monitor/csv_files.hpp"

#include <fcntl.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/write_target.hpp"

namespace shardkit::trainer::monitor {
namespace {

// Python's csv.writer ends rows with its default dialect's terminator.
constexpr char kRowEnd[] = "\r\n";

}  // namespace

std::string csv_file_name(std::string_view tag) {
  std::string name(tag);
  std::replace(name.begin(), name.end(), '/', '_');
  std::replace(name.begin(), name.end(), ' ', '_');
  return name + ".csv";
}

std::string csv_column(std::string_view tag) {
  const size_t slash = tag.rfind('/');
  return std::string(slash == std::string_view::npos ? tag : tag.substr(slash + 1));
}

std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // The shortest round-trip digits and their exponent, from "d.ddde±XX".
  char buffer[64];
  const std::to_chars_result r =
      std::to_chars(buffer, buffer + sizeof(buffer), std::fabs(x), std::chars_format::scientific);
  const std::string text(buffer, r.ptr);
  const size_t e = text.find('e');
  std::string digits = text.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(text.substr(e + 1));
  std::string out = std::signbit(x) ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    // Scientific, as Python writes it: "1e-05", "1.5e+16" (at least two exponent digits).
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  const auto point = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= point) return out + digits + std::string(point - digits.size(), '0') + ".0";
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

CsvSink::CsvSink(std::filesystem::path folder) : folder_(std::move(folder)) {}

void CsvSink::write(std::span<const Scalar> scalars) {
  for (const Scalar& s : scalars) {
    auto it = files_.find(s.tag);
    std::string text;
    if (it == files_.end()) {
      FileDescriptor file = open_own_file(folder_ / csv_file_name(s.tag), O_WRONLY | O_APPEND | O_CREAT);
      if (file.size() == 0) text = "step," + csv_column(s.tag) + kRowEnd;
      it = files_.emplace(s.tag, std::move(file)).first;
    }
    text += std::to_string(s.samples) + "," + python_float(s.value) + kRowEnd;
    append(it->second, text);
  }
}

std::string CsvSink::describe() const {
  return "CSV files (one per tag) to " + folder_.string();
}

}  // namespace shardkit::trainer::monitor
