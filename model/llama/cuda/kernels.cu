#include <numeric>

#include "model/cuda/cuda_common.hpp"
#include "model/cuda/launch.cuh"
#include "model/cuda/vec.cuh"
#include "model/llama/cuda/kernels.hpp"

namespace shardkit::model::llama {
namespace {

using cuda::blocks_for;
using cuda::check_launch;
using cuda::from_float;
using cuda::load_vec;
using cuda::store_vec;
using cuda::to_float;
using cuda::Vec;
using cuda::with_pack_width;

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* inputs, const T* embed, int N, int H) {
  const int64_t total = int64_t{N} * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = embed[int64_t{inputs[i / H]} * H + i % H];
  }
}

// A thread per W adjacent channel pairs (row, head, i..i+W): (x_i, x_{i+D/2}) turned by the angle at
// the row's position, `direction` -1 turning back; rows `ld` elements apart, their first `heads`
// heads turned; 16-byte accesses where D/2 and ld allow.
template <typename T, int W>
__global__ void rope_kernel(T* x, int64_t ld, const float* cos, const float* sin, int64_t N, int S, int heads, int D,
                            float direction) {
  const int groups = D / 2 / W;
  const int64_t total = N * heads * groups;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int i0 = static_cast<int>(idx % groups) * W;
    const int64_t head_row = idx / groups;  // row * heads + head: heads of a row are adjacent
    const int64_t row = head_row / heads;
    const int t = static_cast<int>(row % S);
    const float* c = cos + int64_t{t} * (D / 2) + i0;
    const float* s = sin + int64_t{t} * (D / 2) + i0;
    T* lo = x + row * ld + (head_row % heads) * D + i0;
    T* hi = lo + D / 2;
    Vec<T, W> a = load_vec<W>(lo), b = load_vec<W>(hi);
    for (int i = 0; i < W; ++i) {
      const float av = to_float(a.v[i]), bv = to_float(b.v[i]), si = direction * s[i];
      a.v[i] = from_float<T>(av * c[i] - bv * si);
      b.v[i] = from_float<T>(bv * c[i] + av * si);
    }
    store_vec(lo, a);
    store_vec(hi, b);
  }
}

// A thread per W adjacent elements (row r, columns j..j+W) of the (N, I) product, W dividing I:
// gate and up are the halves of gate_up's row r (row stride 2I).
template <typename T, int W>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int I) {
  const int64_t packs = N * I / W;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs; p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = p * W / I, j = p * W % I;
    const T* gate = gate_up + r * 2 * I + j;
    const Vec<T, W> g = load_vec<W>(gate), u = load_vec<W>(gate + I);
    Vec<T, W> o;
    for (int i = 0; i < W; ++i) {
      const float gv = to_float(g.v[i]);
      o.v[i] = from_float<T>(gv / (1.0f + expf(-gv)) * to_float(u.v[i]));
    }
    store_vec(out + p * W, o);
  }
}

template <typename T, int W>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, int64_t ld_dout, const T* gate_up, int64_t N,
                                       int I) {
  const int64_t packs = N * I / W;
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < packs; p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = p * W / I, j = p * W % I;
    const T* gate = gate_up + r * 2 * I + j;
    const Vec<T, W> g = load_vec<W>(gate), u = load_vec<W>(gate + I), d = load_vec<W>(dout + r * ld_dout + j);
    Vec<T, W> dg, du;
    for (int i = 0; i < W; ++i) {
      const float gv = to_float(g.v[i]), uv = to_float(u.v[i]), dv = to_float(d.v[i]);
      const float sig = 1.0f / (1.0f + expf(-gv));
      du.v[i] = from_float<T>(dv * gv * sig);
      dg.v[i] = from_float<T>(dv * uv * sig * (1.0f + gv * (1.0f - sig)));
    }
    T* dgate = dgate_up + r * 2 * I + j;
    store_vec(dgate + I, du);
    store_vec(dgate, dg);
  }
}

template <typename T>
void rope(T* x, int64_t ld, const float* cos, const float* sin, int B, int S, int heads, int D, float direction,
          cudaStream_t st) {
  const int64_t N = int64_t{B} * S;
  if (N == 0) return;
  with_pack_width<T>(
      std::gcd(int64_t{D / 2}, ld),  // packs neither straddle a head's halves nor a row's start
      [&](auto width) {
        constexpr int W = decltype(width)::value;
        rope_kernel<T, W>
            <<<blocks_for(N * heads * (D / 2 / W), 256), 256, 0, st>>>(x, ld, cos, sin, N, S, heads, D, direction);
      },
      x);
  check_launch();
}

}  // namespace

template <typename T>
void embedding_forward(T* out, const int32_t* inputs, const T* embed, int N, int H, cudaStream_t st) {
  if (N == 0) return;
  embedding_forward_kernel<<<blocks_for(int64_t{N} * H, 256), 256, 0, st>>>(out, inputs, embed, N, H);
  check_launch();
}

template <typename T>
void rope_forward(T* x, int64_t ld, const float* cos, const float* sin, int B, int S, int heads, int D,
                  cudaStream_t st) {
  rope(x, ld, cos, sin, B, S, heads, D, 1.0f, st);
}

template <typename T>
void rope_backward(T* dx, int64_t ld, const float* cos, const float* sin, int B, int S, int heads, int D,
                   cudaStream_t st) {
  rope(dx, ld, cos, sin, B, S, heads, D, -1.0f, st);
}

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int N, int I, cudaStream_t st) {
  if (int64_t{N} * I == 0) return;
  with_pack_width<T>(
      I,  // packs do not straddle a row's halves
      [&](auto width) {
        constexpr int W = decltype(width)::value;
        swiglu_forward_kernel<T, W><<<blocks_for(int64_t{N} * I / W, 256), 256, 0, st>>>(out, gate_up, N, I);
      },
      out, gate_up);
  check_launch();
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, int64_t ld_dout, const T* gate_up, int N, int I, cudaStream_t st) {
  if (int64_t{N} * I == 0) return;
  with_pack_width<T>(
      std::gcd(int64_t{I}, ld_dout),
      [&](auto width) {
        constexpr int W = decltype(width)::value;
        swiglu_backward_kernel<T, W>
            <<<blocks_for(int64_t{N} * I / W, 256), 256, 0, st>>>(dgate_up, dout, ld_dout, gate_up, N, I);
      },
      dgate_up, dout, gate_up);
  check_launch();
}

#define SHARDKIT_INSTANTIATE(T)                                                                              \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int, int, cudaStream_t);                  \
  template void rope_forward<T>(T*, int64_t, const float*, const float*, int, int, int, int, cudaStream_t);  \
  template void rope_backward<T>(T*, int64_t, const float*, const float*, int, int, int, int, cudaStream_t); \
  template void swiglu_forward<T>(T*, const T*, int, int, cudaStream_t);                                     \
  template void swiglu_backward<T>(T*, const T*, int64_t, const T*, int, int, cudaStream_t);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::model::llama
