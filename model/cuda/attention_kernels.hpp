// Which kernels run 16-bit attention on a GPU: the mma.sync kernels (flash_attention.hpp, every GPU
// the build targets) or the Hopper kernels (hopper_attention.hpp, compute capability 9.0), chosen by
// the environment variable SHARDKIT_ATTENTION, read once:
//   auto  the Hopper kernels where they can run, else the mma.sync kernels (the default);
//   mma   the mma.sync kernels everywhere (to compare, or to rule the Hopper kernels out);
//   sm90  the Hopper kernels, and an error where they cannot run (another device, head size 32).
// fp32 attention has its own kernels either way.
#pragma once

#include <string_view>

#include "model/cuda/kernels.hpp"

namespace shardkit::model::cuda {

enum class AttentionKernels { kMma, kSm90, kAuto };

inline constexpr const char* kAttentionVariable = "SHARDKIT_ATTENTION";

// `text` as a setting; Error(kInvalidInput) naming the variable and its values otherwise.
AttentionKernels parse_attention_kernels(std::string_view text);

// The process's setting (kAuto when the variable is unset or empty).
AttentionKernels attention_kernels();

// Whether this call of the 16-bit attention runs on the Hopper kernels under `setting`; dout is the
// backward pass's output gradient (null for the forward pass).
bool use_hopper_attention(AttentionKernels setting, const AttentionShape& shape, const void* q, const void* k,
                          const void* v, const void* dout);

}  // namespace shardkit::model::cuda
