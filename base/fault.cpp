#include "base/fault.hpp"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

namespace shardkit {
namespace {

struct FaultSpec {
  std::string point;
  std::optional<int64_t> rank;
  std::optional<int64_t> step;
};

std::optional<int64_t> integer_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  return std::strtoll(text, nullptr, 10);
}

const std::optional<FaultSpec>& spec() {
  static const std::optional<FaultSpec> s = []() -> std::optional<FaultSpec> {
    const char* point = std::getenv("SHARDKIT_FAULT");
    if (point == nullptr || *point == '\0') return std::nullopt;
    return FaultSpec{point, integer_env("SHARDKIT_FAULT_RANK"), integer_env("SHARDKIT_FAULT_STEP")};
  }();
  return s;
}

thread_local bool active = false;
thread_local int active_rank = 0;
thread_local int64_t active_step = 0;

}  // namespace

FaultScope::FaultScope(int rank, int64_t step)
    : outer_active_(active), outer_rank_(active_rank), outer_step_(active_step) {
  active = true;
  active_rank = rank;
  active_step = step;
}

FaultScope::~FaultScope() {
  active = outer_active_;
  active_rank = outer_rank_;
  active_step = outer_step_;
}

bool fault_armed(std::string_view point, int rank, int64_t step) {
  const auto& s = spec();
  return s && s->point == point && (!s->rank || *s->rank == rank) && (!s->step || *s->step == step);
}

bool fault_armed(std::string_view point) {
  return active && fault_armed(point, active_rank, active_step);
}

void fault_delay() {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(fault_delay_ms()));
}

double fault_delay_ms() {
  static const double ms = static_cast<double>(integer_env("SHARDKIT_FAULT_DELAY_MS").value_or(1000));
  return ms;
}

void crash_point(std::string_view point) {
  if (fault_armed(point)) std::raise(SIGKILL);
}

void crash_point(std::string_view point, int rank, int64_t step) {
  if (fault_armed(point, rank, step)) std::raise(SIGKILL);
}

}  // namespace shardkit
