// Console helpers of the command line: byte sizes in and out, aligned tables, and a progress
// reporter (a bar on a terminal, a plain line every few seconds otherwise, nothing with --quiet).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardkit::cli {

// "1GiB", "512MiB", "5GB", "1.5G", "4096" -> bytes. Error(kInvalidInput) naming `option` otherwise.
int64_t parse_size(std::string_view text, std::string_view option);
// 1234567 -> "1.23 MB".
std::string format_bytes(double bytes);
// 1234567 -> "1,234,567".
std::string format_count(int64_t value);

// Prints rows as columns separated by two spaces; the first row is the header.
void print_table(const std::vector<std::vector<std::string>>& rows, int indent = 0);

class Progress {
 public:
  Progress(std::string label, bool quiet);
  ~Progress();
  // (done, total) in bytes.
  void update(int64_t done, int64_t total);
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  bool enabled_;
  bool tty_;
  bool drawn_ = false;
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace shardkit::cli
