#include "cli/console.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "base/error.hpp"

namespace shardkit::cli {

void print_table(const std::vector<std::vector<std::string>>& raw_rows, int indent) {
  std::vector<std::vector<std::string>> rows;
  rows.reserve(raw_rows.size());
  for (const auto& raw : raw_rows) {
    auto& row = rows.emplace_back();
    for (const std::string& cell : raw) row.push_back(escape_control(cell));
  }
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
    std::printf("%s\n", line.c_str());  // escaped cell by cell above
  }
}

namespace {

// SHARDKIT_PROGRESS_INTERVAL: seconds between two plain progress lines (default 5), read once.
double plain_interval_seconds() {
  static const double seconds = [] {
    const char* text = std::getenv("SHARDKIT_PROGRESS_INTERVAL");
    if (text == nullptr || *text == '\0') return 5.0;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (*end != '\0' || !std::isfinite(value) || value < 0) {
      fail(ErrorKind::kInvalidInput,
           std::string("SHARDKIT_PROGRESS_INTERVAL: '") + text + "' is not a number of seconds >= 0");
    }
    return value;
  }();
  return seconds;
}

}  // namespace

Progress::Progress(std::string label, bool quiet, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      enabled_(!quiet),
      tty_(::isatty(STDERR_FILENO) == 1),
      // A terminal redraws ten times a second; a log gets a line every few seconds.
      interval_s_(tty_ ? 0.1 : plain_interval_seconds()),
      start_(Clock::now()),
      last_(start_) {}

Progress::~Progress() {
  close();
}

void Progress::update(int64_t done, int64_t total) {
  if (!enabled_) return;
  updated_ = true;
  done_ = done;
  total_ = total;
  // The complete state is finish()'s to draw, once.
  if (done >= total || seconds_since(last_) < interval_s_) return;
  draw(false);
}

void Progress::finish() {
  // A short job leaves no trace in a log, but a terminal shows its bar once, complete.
  if (enabled_ && (drawn_ || (tty_ && updated_))) draw(true);
  close();
}

void Progress::close() noexcept {
  if (enabled_ && tty_ && drawn_) std::fputc('\n', stderr);
  enabled_ = false;
}

std::string Progress::amount(double value) const {
  return unit_.empty() ? format_bytes(value) : format_count(std::llround(value)) + " " + unit_;
}

void Progress::draw(bool final) {
  const auto now = Clock::now();
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  const double fraction =
      total_ > 0 ? std::clamp(static_cast<double>(done_) / static_cast<double>(total_), 0.0, 1.0) : 1.0;
  // "1.23 MB / 4.00 GB", "1,024 / 4,096 tokens".
  const std::string counts = (unit_.empty() ? format_bytes(static_cast<double>(done_)) : format_count(done_)) + " / " +
                             amount(static_cast<double>(total_));
  char timing[64];
  if (final) {
    std::snprintf(timing, sizeof(timing), "in %.1fs", elapsed);
  } else if (rate > 0) {
    std::snprintf(timing, sizeof(timing), "ETA %.0fs",
                  static_cast<double>(std::max<int64_t>(total_ - done_, 0)) / rate);
  } else {
    std::snprintf(timing, sizeof(timing), "ETA ?");
  }
  char tail[256];
  std::snprintf(tail, sizeof(tail), "%3.0f%%  %s  %s/s  %s", fraction * 100, counts.c_str(), amount(rate).c_str(),
                timing);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    // \r returns to the line's start, \033[K clears what a longer previous draw left after it.
    std::fprintf(stderr, "\r%s [%s%s] %s\033[K", escape_control(label_).c_str(),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), tail);
  } else {
    print_line(stderr, "%s: %s", label_.c_str(), tail);
  }
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace shardkit::cli
