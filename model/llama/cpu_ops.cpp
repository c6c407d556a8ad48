#include "model/llama/cpu_ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/vector_clones.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/vector_math.hpp"

namespace shardkit::model::llama::ops {

using cpu::sgemm;

void embedding_forward(float* out, const int32_t* inputs, const float* embed, int N, int H) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* e = embed + static_cast<int64_t>(inputs[n]) * H;
    std::copy(e, e + H, out + static_cast<int64_t>(n) * H);
  }
}

void embedding_backward(float* dembed, const float* dout, const int32_t* inputs, int N, int H) {
  // Rows with the same token add into the same row: split the channels, not the rows, so that threads
  // never write the same address (and the sums keep one order).
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < H; c0 += 16) {
    const int c1 = std::min(H, c0 + 16);
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * H;
      float* e = dembed + static_cast<int64_t>(inputs[n]) * H;
      for (int c = c0; c < c1; ++c) e[c] += d[c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int N, int H, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* xr = x + static_cast<int64_t>(n) * H;
    float ss = 0.0f;
    for (int c = 0; c < H; ++c) ss += xr[c] * xr[c];
    const float s = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    float* o = out + static_cast<int64_t>(n) * H;
    for (int c = 0; c < H; ++c) o[c] = weight[c] * (xr[c] * s);
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, int N, int H) {
  const int threads = omp_get_max_threads();
  // Per-thread partial sums of dweight, reduced at the end in thread order.
  std::vector<float> partial(static_cast<size_t>(threads) * static_cast<size_t>(H), 0.0f);
#pragma omp parallel
  {
    float* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * static_cast<size_t>(H);
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * H;
      const float* xr = x + static_cast<int64_t>(n) * H;
      const float s = rstd[n];
      // y = w * x * s with s = (mean(x^2) + eps)^-1/2: dx = s * (w dy - x s^2 mean(w dy x)).
      float mean_dnorm_x = 0.0f;
      for (int c = 0; c < H; ++c) mean_dnorm_x += weight[c] * d[c] * xr[c];
      mean_dnorm_x /= static_cast<float>(H);
      float* di = dx + static_cast<int64_t>(n) * H;
      for (int c = 0; c < H; ++c) {
        dw[c] += d[c] * xr[c] * s;
        di[c] += s * (weight[c] * d[c] - xr[c] * s * s * mean_dnorm_x);
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* dw = partial.data() + static_cast<size_t>(t) * static_cast<size_t>(H);
    for (int c = 0; c < H; ++c) dweight[c] += dw[c];
  }
}

void linear_forward(float* out, const float* in, const float* weight, int N, int IN, int OUT) {
  sgemm(false, true, N, OUT, IN, 1.0f, in, IN, weight, IN, 0.0f, out, OUT);
}

void linear_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight, int N, int IN,
                     int OUT, bool accumulate) {
  sgemm(false, false, N, IN, OUT, 1.0f, dout, OUT, weight, IN, accumulate ? 1.0f : 0.0f, din, IN);
  sgemm(true, false, OUT, IN, N, 1.0f, dout, OUT, in, IN, 1.0f, dweight, IN);
}

namespace {

// Turns every head's channel pairs (i, i + D/2) by the angle whose cosine and sine are given;
// `direction` -1 turns them back.
void rotate(float* x, const float* cos, const float* sin, int B, int T, int heads, int D, float direction) {
  const int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* c = cos + static_cast<int64_t>(t) * half;
      const float* s = sin + static_cast<int64_t>(t) * half;
      float* row = x + (static_cast<int64_t>(b) * T + t) * heads * D;
      for (int h = 0; h < heads; ++h) {
        float* v = row + static_cast<int64_t>(h) * D;
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b2 = v[i + half], si = direction * s[i];
          v[i] = a * c[i] - b2 * si;
          v[i + half] = b2 * c[i] + a * si;
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int D) {
  rotate(x, cos, sin, B, T, heads, D, 1.0f);
}

void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int D) {
  rotate(dx, cos, sin, B, T, heads, D, -1.0f);
}

// The SwiGLU passes at the machine's vector width (exp_vec is branch-free; this file is compiled
// without fused multiply-adds, so every clone gives the same bits: model/CMakeLists.txt).
SHARDKIT_VECTOR_CLONES void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + cpu::exp_vec(-g)) * up[i];
  }
}

SHARDKIT_VECTOR_CLONES void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                            const float* up, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = 1.0f / (1.0f + cpu::exp_vec(-g));
    const float silu = g * s;
    dup[i] = dout[i] * silu;
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
  }
}

}  // namespace shardkit::model::llama::ops
