#include "trainer/cpu_ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer/gemm.hpp"

namespace shardkit::trainer::ops {
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

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* base = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
      float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
      for (int t = 0; t < T; ++t) {
        const float* q = base + t * C3;
        float* row = a + static_cast<int64_t>(t) * T;
        float max = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          const float* k = base + u * C3 + C;
          float dot = 0.0f;
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          row[u] = dot * scale;
          max = std::max(max, row[u]);
        }
        float sum = 0.0f;
        for (int u = 0; u <= t; ++u) {
          row[u] = std::exp(row[u] - max);
          sum += row[u];
        }
        const float inv = 1.0f / sum;
        for (int u = 0; u <= t; ++u) row[u] *= inv;
        for (int u = t + 1; u < T; ++u) row[u] = 0.0f;
        float* o = out + (static_cast<int64_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int u = 0; u <= t; ++u) {
          const float* v = base + u * C3 + 2 * C;
          const float p = row[u];
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel
  {
    std::vector<float> datt(static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const float* base = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
        float* dbase = dqkv + static_cast<int64_t>(b) * T * C3 + h * hs;
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < hs; ++i) dbase[t * C3 + i] = dbase[t * C3 + C + i] = dbase[t * C3 + 2 * C + i] = 0.0f;
        }
        const float* a = att + (static_cast<int64_t>(b) * NH + h) * T * T;
        for (int t = 0; t < T; ++t) {
          const float* row = a + static_cast<int64_t>(t) * T;
          const float* d = dout + (static_cast<int64_t>(b) * T + t) * C + h * hs;
          // d(probabilities) and d(v)
          float dot_sum = 0.0f;
          for (int u = 0; u <= t; ++u) {
            const float* v = base + u * C3 + 2 * C;
            float* dv = dbase + u * C3 + 2 * C;
            float g = 0.0f;
            for (int i = 0; i < hs; ++i) {
              g += d[i] * v[i];
              dv[i] += row[u] * d[i];
            }
            datt[static_cast<size_t>(u)] = g;
            dot_sum += g * row[u];
          }
          // softmax backward, then d(q) and d(k) of the scaled scores
          const float* q = base + t * C3;
          float* dq = dbase + t * C3;
          for (int u = 0; u <= t; ++u) {
            const float dscore = row[u] * (datt[static_cast<size_t>(u)] - dot_sum) * scale;
            const float* k = base + u * C3 + C;
            float* dk = dbase + u * C3 + C;
            for (int i = 0; i < hs; ++i) {
              dq[i] += dscore * k[i];
              dk[i] += dscore * q[i];
            }
          }
        }
      }
    }
  }
}

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = grad * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

double head_forward_backward(float* dinp, float* dwte, float* logits, const float* inp, const float* wte,
                             const int32_t* targets, int N, int C, int V, float grad_scale, int64_t n_total) {
  double loss = 0.0;
  const float dscale = grad_scale / static_cast<float>(n_total);
  for (int r0 = 0; r0 < N; r0 += kHeadBlockRows) {
    const int rows = std::min(kHeadBlockRows, N - r0);
    const float* x = inp + static_cast<int64_t>(r0) * C;
    sgemm(false, true, rows, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
    double block_loss = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : block_loss)
    for (int r = 0; r < rows; ++r) {
      float* row = logits + static_cast<int64_t>(r) * V;
      const int target = targets[r0 + r];
      float max = -INFINITY;
      for (int v = 0; v < V; ++v) max = std::max(max, row[v]);
      double sum = 0.0;
      for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - max));
      const double lse = static_cast<double>(max) + std::log(sum);
      block_loss += lse - static_cast<double>(row[target]);
      if (dinp) {
        // d(loss)/d(logit) = softmax - onehot, times grad_scale / n_total.
        for (int v = 0; v < V; ++v) row[v] = static_cast<float>(std::exp(static_cast<double>(row[v]) - lse)) * dscale;
        row[target] -= dscale;
      }
    }
    loss += block_loss;
    if (dinp) {
      sgemm(false, false, rows, C, V, 1.0f, logits, V, wte, C, 0.0f, dinp + static_cast<int64_t>(r0) * C, C);
      sgemm(true, false, V, C, rows, 1.0f, logits, V, x, C, 1.0f, dwte, C);
    }
  }
  return loss;
}

}  // namespace shardkit::trainer::ops
