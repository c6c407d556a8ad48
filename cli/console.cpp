#include "cli/console.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ckpt/error.hpp"

namespace shardkit::cli {

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

void print_table(const std::vector<std::vector<std::string>>& rows, int indent) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line(static_cast<size_t>(indent), ' ');
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

Progress::Progress(std::string label, bool quiet)
    : label_(std::move(label)),
      enabled_(!quiet),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(Clock::now()),
      last_(start_) {}

Progress::~Progress() {
  finish();
}

void Progress::update(int64_t done, int64_t total) {
  if (!enabled_) return;
  const auto now = Clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  // A terminal redraws ten times a second; a log gets a line every five seconds.
  if (since_last < (tty_ ? 0.1 : 5.0) && done < total) return;
  if (!tty_ && done >= total && !drawn_) return;  // short jobs leave no trace in logs
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  const double fraction = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0;
  const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  char tail[160];
  std::snprintf(tail, sizeof(tail), "%3.0f%%  %s / %s  %s/s  ETA %.0fs", fraction * 100,
                format_bytes(static_cast<double>(done)).c_str(), format_bytes(static_cast<double>(total)).c_str(),
                format_bytes(rate).c_str(), eta);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r%s [%s%s] %s\033[K", label_.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), tail);
  } else {
    std::fprintf(stderr, "%s: %s\n", label_.c_str(), tail);
  }
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::finish() {
  if (enabled_ && tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
  enabled_ = false;
}

}  // namespace shardkit::cli
