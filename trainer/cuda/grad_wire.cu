#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "model/cuda/cuda_common.hpp"
#include "model/cuda/kernels.hpp"
#include "trainer/cuda/grad_wire.hpp"

namespace shardkit::trainer::cuda {

using model::cuda::add_inplace;

namespace {

// Eight elements per thread (16 bytes of 16-bit values, 32 of floats) where both pointers allow it;
// the rest, and misaligned pieces, one at a time.
constexpr int kVec = 8;

__device__ __forceinline__ uint16_t narrow(float x, __nv_bfloat16) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ uint16_t narrow(float x, __half) {
  return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ float widen(uint16_t x, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16(x));
}
__device__ __forceinline__ float widen(uint16_t x, __half) {
  return __half2float(__ushort_as_half(x));
}

bool aligned16(const void* a, const void* b) {
  return reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

template <typename W>
__global__ void narrow_kernel(uint16_t* out, const float* in, int64_t n, int64_t vectors) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    const float4 a = reinterpret_cast<const float4*>(in)[2 * v], b = reinterpret_cast<const float4*>(in)[2 * v + 1];
    const float x[kVec] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    alignas(16) uint16_t o[kVec];
    for (int i = 0; i < kVec; ++i) o[i] = narrow(x[i], W{});
    reinterpret_cast<uint4*>(out)[v] = *reinterpret_cast<const uint4*>(o);
  }
  for (int64_t i = vectors * kVec + first; i < n; i += stride) out[i] = narrow(in[i], W{});
}

template <typename W>
__global__ void widen_kernel(float* out, const uint16_t* in, int64_t n, int64_t vectors, bool add) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    const uint4 raw = reinterpret_cast<const uint4*>(in)[v];
    const uint16_t* x = reinterpret_cast<const uint16_t*>(&raw);
    float4* o = reinterpret_cast<float4*>(out) + 2 * v;
    alignas(16) float y[kVec] = {};
    if (add) {
      reinterpret_cast<float4*>(y)[0] = o[0];
      reinterpret_cast<float4*>(y)[1] = o[1];
    }
    for (int i = 0; i < kVec; ++i) y[i] += widen(x[i], W{});
    o[0] = reinterpret_cast<const float4*>(y)[0];
    o[1] = reinterpret_cast<const float4*>(y)[1];
  }
  for (int64_t i = vectors * kVec + first; i < n; i += stride) out[i] = (add ? out[i] : 0.0f) + widen(in[i], W{});
}

int blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n / kVec + 255) / 256, 1, 132 * 16));
}

// Calls f(W{}) with W the 16-bit type of `wire` (bf16 or fp16).
template <typename F>
void with_16bit_type(ckpt::DType wire, F&& f) {
  if (wire == ckpt::DType::kBF16) {
    f(__nv_bfloat16{});
  } else {
    f(__half{});
  }
}

}  // namespace

ncclDataType_t nccl_type(ckpt::DType wire) noexcept {
  return wire == ckpt::DType::kBF16 ? ncclBfloat16 : wire == ckpt::DType::kF16 ? ncclHalf : ncclFloat;
}

size_t wire_bytes(ckpt::DType wire) noexcept {
  return wire == ckpt::DType::kF32 ? sizeof(float) : sizeof(uint16_t);
}

void to_wire(void* out, ckpt::DType wire, const float* in, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  if (wire == ckpt::DType::kF32) {
    CUDA_CHECK(cudaMemcpyAsync(out, in, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, st));
    return;
  }
  auto* o = static_cast<uint16_t*>(out);
  const int64_t vectors = aligned16(o, in) ? n / kVec : 0;
  with_16bit_type(wire, [&](auto w) { narrow_kernel<decltype(w)><<<blocks(n), 256, 0, st>>>(o, in, n, vectors); });
  CUDA_CHECK(cudaGetLastError());
}

void from_wire(float* out, ckpt::DType wire, const void* in, int64_t n, bool add, cudaStream_t st) {
  if (n == 0) return;
  if (wire == ckpt::DType::kF32) {
    const auto* x = static_cast<const float*>(in);
    if (add) {
      add_inplace(out, x, n, st);
    } else {
      CUDA_CHECK(cudaMemcpyAsync(out, x, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, st));
    }
    return;
  }
  const auto* x = static_cast<const uint16_t*>(in);
  const int64_t vectors = aligned16(out, x) ? n / kVec : 0;
  with_16bit_type(wire, [&](auto w) { widen_kernel<decltype(w)><<<blocks(n), 256, 0, st>>>(out, x, n, vectors, add); });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardkit::trainer::cuda
