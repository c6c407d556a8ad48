// Runs a parser of untrusted bytes in a child process of its own, so that a crash or an endless loop
// inside a library shardkit does not control (libhdf5 parsing a shard's metadata) becomes an Error
// naming the file, never the end of the calling process. The child is a fresh copy of the running
// executable (/proc/self/exe, started with posix_spawn: no locks, threads, MPI or CUDA state are
// inherited) that serves one registered entry point, held to limits: CPU time per request, wall time,
// address space, no core dump and no file writes. The file to parse is passed as an open descriptor
// (SCM_RIGHTS), so the child reads exactly the file the caller opened.
//
// Starting the child costs tens of milliseconds (the executable and its libraries load), so it stays
// to serve the next requests; one that crashed or ran out of time is ended, and the next request
// starts a fresh one. Requests of one entry point are served one at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.hpp"

namespace shardkit::ckpt::isolated {

// A child's work: takes the request and the descriptor of the file to parse, returns the response.
// An Error it throws reaches the caller with its kind and message.
using EntryPoint = std::string (*)(std::string_view request, int file_fd);

struct Limits {
  double seconds = 60;  // CPU time, and four times that in wall time
  int64_t max_response_bytes = int64_t{1} << 30;
};

// Runs `entry` (registered with SHARDKIT_ISOLATED_ENTRY in a source file linked into this executable)
// on `file_fd` in a child process. `where` names the file in errors: a crash is Error(kCorrupt)
// "<where>: <what> crashed (SIGSEGV)...", a child past its time limit Error(kCorrupt) likewise.
std::string run(std::string_view entry, std::string_view request, int file_fd, const std::string& where,
                std::string_view what, const Limits& limits);

// Ends the children (a test that changes the environment they inherit wants fresh ones) and scales
// every limit's seconds (tests and fuzzing hold damaged inputs to a short time; 1 by default).
void restart_for_testing(double time_scale = 1);

// The child side: when this process was started by run() for `entry`, serves requests with
// `function` until the caller goes away, then exits; otherwise returns at once. Called from a
// constructor (SHARDKIT_ISOLATED_ENTRY), before main.
void serve_if_child(int argc, char** argv, std::string_view entry, EntryPoint function);

// A byte stream of integers and strings for requests and responses. Reading past the end, or a length
// beyond what is left, is Error(kInternal): the two sides are the same executable.
class Wire {
 public:
  Wire() = default;
  explicit Wire(std::string_view bytes) : in_(bytes) {}

  void put_i64(int64_t value);
  void put_string(std::string_view value);
  // Arrays of int64_t or uint64_t.
  template <typename T>
  void put_array(const std::vector<T>& values);
  std::string take() { return std::move(out_); }

  int64_t get_i64();
  std::string get_string();
  template <typename T>
  std::vector<T> get_array();
  bool at_end() const noexcept { return in_.empty(); }

 private:
  std::string_view next(size_t bytes);
  std::string out_;
  std::string_view in_;
};

}  // namespace shardkit::ckpt::isolated

// Registers `function` as the isolated entry point `name` of every executable this file is linked
// into. A constructor, so the child runs it before main and before anything else of the program.
#define SHARDKIT_ISOLATED_ENTRY(name, function)                                                  \
  __attribute__((constructor)) static void shardkit_isolated_##function(int argc, char** argv) { \
    ::shardkit::ckpt::isolated::serve_if_child(argc, argv, name, function);                      \
  }
