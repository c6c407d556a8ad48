#include "model/cuda/attention_kernels.hpp"

#include <cstdlib>
#include <string>

#include "base/error.hpp"
#include "model/cuda/hopper_attention.hpp"

namespace shardkit::model::cuda {

AttentionKernels parse_attention_kernels(std::string_view text) {
  if (text == "mma") return AttentionKernels::kMma;
  if (text == "sm90") return AttentionKernels::kSm90;
  if (text == "auto") return AttentionKernels::kAuto;
  fail(ErrorKind::kInvalidInput,
       std::string(kAttentionVariable) + "=" + std::string(text) + ": expected mma, sm90 or auto");
}

AttentionKernels attention_kernels() {
  static const AttentionKernels setting = [] {
    const char* text = std::getenv(kAttentionVariable);
    return text == nullptr || *text == '\0' ? AttentionKernels::kAuto : parse_attention_kernels(text);
  }();
  return setting;
}

bool use_hopper_attention(AttentionKernels setting, const AttentionShape& shape, const void* q, const void* k,
                          const void* v, const void* dout) {
  if (setting == AttentionKernels::kMma) return false;
  const bool supported = hopper_attention_supports(shape, q, k, v, dout);
  if (!supported && setting == AttentionKernels::kSm90) {
    fail(ErrorKind::kInvalidInput, std::string(kAttentionVariable) +
                                       "=sm90: the Hopper attention kernels need a compute capability 9.0 device, "
                                       "head size 64 or 128 and 16-byte aligned rows (head size " +
                                       std::to_string(shape.HS) + "); use mma or auto");
  }
  return supported;
}

}  // namespace shardkit::model::cuda
