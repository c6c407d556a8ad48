#include "model/gpt2/cpu_ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/vector_clones.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/vector_math.hpp"

namespace shardkit::model::gpt2::ops {

using cpu::sgemm;
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void encoder_forward(float* out, const int32_t* inputs, const float* wte, const float* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < B * T; ++n) {
    const float* e = wte + static_cast<int64_t>(inputs[n]) * C;
    const float* p = wpe + static_cast<int64_t>(n % T) * C;
    float* o = out + static_cast<int64_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inputs, int B, int T, int C) {
  // Rows with the same token add into the same dwte row: split the channels, not the rows, so that
  // threads never write the same address.
#pragma omp parallel for schedule(static)
  for (int c0 = 0; c0 < C; c0 += 16) {
    const int c1 = std::min(C, c0 + 16);
    for (int n = 0; n < B * T; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * C;
      float* e = dwte + static_cast<int64_t>(inputs[n]) * C;
      float* p = dwpe + static_cast<int64_t>(n % T) * C;
      for (int c = c0; c < c1; ++c) {
        e[c] += d[c];
        p[c] += d[c];
      }
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<int64_t>(n) * C;
    float m = 0.0f;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    float v = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      v += d * d;
    }
    v /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + kLayerNormEps);
    float* o = out + static_cast<int64_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  const int threads = omp_get_max_threads();
  // Per-thread partial sums of dweight and dbias, reduced at the end in thread order.
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * static_cast<size_t>(C), 0.0f);
#pragma omp parallel
  {
    float* dw = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * static_cast<size_t>(C);
    float* db = dw + C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* d = dout + static_cast<int64_t>(n) * C;
      const float* x = inp + static_cast<int64_t>(n) * C;
      const float m = mean[n];
      const float s = rstd[n];
      float mean_dnorm = 0.0f;
      float mean_dnorm_norm = 0.0f;
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * d[c];
        mean_dnorm += dnorm;
        mean_dnorm_norm += dnorm * norm;
      }
      mean_dnorm /= static_cast<float>(C);
      mean_dnorm_norm /= static_cast<float>(C);
      float* di = dinp + static_cast<int64_t>(n) * C;
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        db[c] += d[c];
        dw[c] += norm * d[c];
        di[c] += (weight[c] * d[c] - mean_dnorm - norm * mean_dnorm_norm) * s;
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* dw = partial.data() + static_cast<size_t>(t) * 2 * static_cast<size_t>(C);
    for (int c = 0; c < C; ++c) {
      dweight[c] += dw[c];
      dbias[c] += dw[C + c];
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + static_cast<int64_t>(n) * OC);
  sgemm(false, false, N, OC, IC, 1.0f, inp, IC, weight, OC, 1.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  sgemm(false, true, N, IC, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, IC);
  sgemm(true, false, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, OC);
#pragma omp parallel for schedule(static)
  for (int o = 0; o < OC; ++o) {
    float sum = 0.0f;
    for (int n = 0; n < N; ++n) sum += dout[static_cast<int64_t>(n) * OC + o];
    dbias[o] += sum;
  }
}

// The GELU passes at the machine's vector width (tanh_vec is branch-free; this file is compiled
// without fused multiply-adds, so every clone gives the same bits: model/CMakeLists.txt).
SHARDKIT_VECTOR_CLONES void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + cpu::tanh_vec(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

SHARDKIT_VECTOR_CLONES void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = cpu::tanh_vec(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = grad * dout[i];
  }
}

}  // namespace shardkit::model::gpt2::ops
