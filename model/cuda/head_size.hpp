// The attention kernels are compiled for each supported head size; this turns the runtime head size
// into the compile-time one, in one place.
#pragma once

#include <string>
#include <type_traits>

#include "base/error.hpp"

namespace shardkit::model::cuda {

// The head sizes the attention kernels are compiled for, as a test and as words; with_head_size's cases.
constexpr bool supported_head_size(int head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}
inline constexpr const char* kHeadSizes = "32, 64 and 128";

// Calls f(std::integral_constant<int, HS>{}) for a supported head size HS; any other is an error.
template <typename F>
void with_head_size(int head_size, F&& f) {
  switch (head_size) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      fail(ErrorKind::kInvalidInput,
           std::string("CUDA attention supports head sizes ") + kHeadSizes + ", not " + std::to_string(head_size));
  }
}

}  // namespace shardkit::model::cuda
