// A C entry to the attention kernels (model/cuda/flash_attention.hpp, hopper_attention.hpp) for
// bench/attention_tflops.py, which loads it with ctypes and times them beside PyTorch's SDPA backends on
// the same tensors, in the same process and on the same stream. Not part of shardkit: a benchmark's
// handle on the kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <exception>
#include <string>

#include "model/cuda/flash_attention.hpp"
#include "model/cuda/hopper_attention.hpp"
#include "model/cuda/kernels.hpp"

namespace {

thread_local std::string last_error;

// dtype 0: bf16, 1: fp16; calls f with a null pointer of that type.
template <typename F>
int with_dtype(int dtype, F&& f) {
  try {
    if (dtype == 0) {
      f(static_cast<__nv_bfloat16*>(nullptr));
    } else if (dtype == 1) {
      f(static_cast<__half*>(nullptr));
    } else {
      last_error = "dtype " + std::to_string(dtype) + ": expected 0 (bf16) or 1 (fp16)";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // namespace

extern "C" {

// kernel 0: the mma.sync kernels (flash_attention.hpp); 1: the sm_90 kernels (hopper_attention.hpp),
// which refuse a device or shape they do not take. Training runs the second where it can, the first
// elsewhere (SHARDKIT_ATTENTION).
//
// q (B, S, NH * HS) with row stride ld_q; k and v (B, S, NKV * HS) with row stride ld_kv; out (B, S,
// NH * HS); lse (B, NH, S) in fp32. Queued on `stream` (a cudaStream_t). Returns 0, or 1 with
// shardkit_attention_error() saying why.
int shardkit_attention_forward(int kernel, int dtype, void* out, float* lse, const void* q, const void* k,
                               const void* v, int B, int S, int NH, int NKV, int HS, int64_t ld_q, int64_t ld_kv,
                               void* stream) {
  const shardkit::model::cuda::AttentionShape shape{B, S, NH, NKV, HS, ld_q, ld_kv};
  return with_dtype(dtype, [&]<typename T>(T*) {
    const auto run = kernel == 1 ? &shardkit::model::cuda::hopper_attention_forward<T>
                                 : &shardkit::model::cuda::flash_attention_forward<T>;
    run(static_cast<T*>(out), lse, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), shape,
        static_cast<cudaStream_t>(stream));
  });
}

// The fp32 scratch the backward pass takes, in floats: delta = rowsum(dO o O), one a query row. Asked
// for rather than assumed, so that a build whose backward needs more can be timed beside this one by
// the same script (attention_tflops.py --before).
int64_t shardkit_attention_scratch_floats(int /*kernel*/, int B, int S, int NH, int /*NKV*/, int /*HS*/) {
  return static_cast<int64_t>(B) * NH * S;
}

// dq (as q), dk and dv (as k and v) overwritten; scratch as shardkit_attention_scratch_floats says;
// dout as out.
int shardkit_attention_backward(int kernel, int dtype, void* dq, void* dk, void* dv, float* scratch, const void* dout,
                                const void* out, const void* q, const void* k, const void* v, const float* lse, int B,
                                int S, int NH, int NKV, int HS, int64_t ld_q, int64_t ld_kv, void* stream) {
  const shardkit::model::cuda::AttentionShape shape{B, S, NH, NKV, HS, ld_q, ld_kv};
  return with_dtype(dtype, [&]<typename T>(T*) {
    const auto run = kernel == 1 ? &shardkit::model::cuda::hopper_attention_backward<T>
                                 : &shardkit::model::cuda::flash_attention_backward<T>;
    run(static_cast<T*>(dq), static_cast<T*>(dk), static_cast<T*>(dv), scratch, static_cast<const T*>(dout),
        static_cast<const T*>(out), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), lse,
        shape, static_cast<cudaStream_t>(stream));
  });
}

const char* shardkit_attention_error() {
  return last_error.c_str();
}

}  // extern "C"
