// Console helpers of the command line: byte sizes in and out, aligned tables, and a progress
// reporter (a bar on a terminal, a plain line every few seconds otherwise, nothing with --quiet).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.hpp"
#include "base/text_format.hpp"

namespace shardkit::cli {

// Prints rows as columns separated by two spaces; the first row is the header. Cells are escaped
// (escape_control) before they are measured, so a name from an input can neither break the table
// nor write to the terminal.
void print_table(const std::vector<std::vector<std::string>>& rows, int indent = 0);

// Reports how far a long command has got, on stderr (stdout stays for the command's result):
//  - on a terminal, a bar redrawn in place with '\r', at most ten times a second;
//  - otherwise (a log file, a pipe), a plain line at most every SHARDKIT_PROGRESS_INTERVAL seconds
//    (environment variable, a decimal number, default 5; 0 prints a line at every update, which the
//    tests use). A job that ends before the first line leaves no trace in the log;
//  - nothing at all when `quiet`. Under MPI, the caller passes quiet on every rank but 0.
// finish() ends the report: a terminal's bar is redrawn with the final count and its line ended, a log
// that got lines gets a final one. The destructor only ends the bar's line, so that an error message
// thrown through it starts on a line of its own.
// update() and finish() must be called from one thread at a time.
class Progress {
 public:
  // `unit` names what update() counts: empty for bytes ("1.23 MB / 4.00 GB"), else a noun for a count
  // ("1,024 / 4,096 tokens"). Error(kInvalidInput) for a malformed SHARDKIT_PROGRESS_INTERVAL.
  Progress(std::string label, bool quiet, std::string unit = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of `total` units.
  void update(int64_t done, int64_t total);
  void finish();

 private:
  void draw(bool final);
  // Ends the bar's line on a terminal and stops reporting.
  void close() noexcept;
  std::string amount(double value) const;

  std::string label_;
  std::string unit_;
  bool enabled_;
  bool tty_;
  double interval_s_;     // least time between two draws
  bool updated_ = false;  // update() was called
  bool drawn_ = false;    // something was printed
  int64_t done_ = 0;
  int64_t total_ = 0;
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace shardkit::cli
