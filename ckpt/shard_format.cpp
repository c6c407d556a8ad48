#include "ckpt/shard_format.hpp"

#include <cstdio>

#include "base/error.hpp"

namespace shardkit::ckpt {

std::vector<std::string> adamw_state_names() {
  return {kAdamWStates.begin(), kAdamWStates.end()};
}

std::string shard_file_name(int rank, int world_size) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "shard-%05d-of-%05d.h5", rank, world_size);
  return buffer;
}

std::string step_dir_name(int64_t step) {
  if (step < 0 || step > kMaxStep) {
    fail(ErrorKind::kInvalidInput,
         "step " + std::to_string(step) + " is outside [0, " + std::to_string(kMaxStep) + "] (no checkpoint name)");
  }
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "step-%08lld", static_cast<long long>(step));
  return buffer;
}

int64_t parse_step_dir_name(std::string_view name) noexcept {
  constexpr std::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) return -1;
  const std::string_view digits = name.substr(kPrefix.size());
  if (digits.size() > 12) return -1;  // kMaxStep has 12 digits; more cannot overflow below
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step <= kMaxStep ? step : -1;
}

}  // namespace shardkit::ckpt
