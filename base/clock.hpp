// Elapsed wall time on the steady clock, in the units shardkit reports: every timing of a step, a
// save or a phase goes through these, so that all of them measure alike.
#pragma once

#include <chrono>

namespace shardkit {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace shardkit
