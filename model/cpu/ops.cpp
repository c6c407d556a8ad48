#include "model/cpu/ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/cpu/gemm.hpp"

namespace shardkit::model::cpu {

namespace {

// Row t of a (sequence, head)'s scaled scores q_t . k_u / sqrt(D), u <= t, into row; returns their
// maximum. The forward and the backward pass both call it, so the backward's recomputed scores are
// the forward's bit for bit.
float scaled_scores(float* row, const float* qt, const float* kb, int64_t KW, int t, int D, float scale) {
  float max = -INFINITY;
  for (int u = 0; u <= t; ++u) {
    const float* ku = kb + u * KW;
    float dot = 0.0f;
    for (int i = 0; i < D; ++i) dot += qt[i] * ku[i];
    row[u] = dot * scale;
    max = std::max(max, row[u]);
  }
  return max;
}

}  // namespace

void attention_forward(float* out, float* stats, const float* q, const float* k, const float* v,
                       const AttentionShape& shape) {
  // Plain locals, not a structured binding: OpenMP regions may not name bindings before C++20's
  // rule reached every compiler (Clang 14 refuses them).
  const int B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, D = shape.D;
  const int64_t QW = shape.q_stride, KW = shape.kv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int group = NH / NKV;
  const int64_t OW = static_cast<int64_t>(NH) * D;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const int kvh = h / group;
        const float* kb = k + static_cast<int64_t>(b) * T * KW + static_cast<int64_t>(kvh) * D;
        const float* vb = v + static_cast<int64_t>(b) * T * KW + static_cast<int64_t>(kvh) * D;
        float* st = stats + attention_stats_floats(static_cast<int64_t>(b) * NH + h, 1, T);
        for (int t = 0; t < T; ++t) {
          const float* qt = q + (static_cast<int64_t>(b) * T + t) * QW + static_cast<int64_t>(h) * D;
          const float max = scaled_scores(row.data(), qt, kb, KW, t, D, scale);
          float sum = 0.0f;
          for (int u = 0; u <= t; ++u) {
            row[static_cast<size_t>(u)] = std::exp(row[static_cast<size_t>(u)] - max);
            sum += row[static_cast<size_t>(u)];
          }
          const float inv = 1.0f / sum;
          st[kAttentionStatsPerRow * t] = max;
          st[kAttentionStatsPerRow * t + 1] = inv;
          float* o = out + (static_cast<int64_t>(b) * T + t) * OW + static_cast<int64_t>(h) * D;
          std::fill(o, o + D, 0.0f);
          for (int u = 0; u <= t; ++u) {
            const float* vu = vb + u * KW;
            const float p = row[static_cast<size_t>(u)] * inv;
            for (int i = 0; i < D; ++i) o[i] += p * vu[i];
          }
        }
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* stats, const AttentionShape& shape) {
  const int B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, D = shape.D;
  const int64_t QW = shape.q_stride, KW = shape.kv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int group = NH / NKV;
  const int64_t OW = static_cast<int64_t>(NH) * D;
  // One thread per (sequence, kv head): the query heads that share a kv head add into its dk and dv,
  // so they run in one thread, in head order.
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(T)), datt(static_cast<size_t>(T));
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int kvh = 0; kvh < NKV; ++kvh) {
        const int64_t kv_base = static_cast<int64_t>(b) * T * KW + static_cast<int64_t>(kvh) * D;
        for (int t = 0; t < T; ++t) {
          std::fill(dk + kv_base + t * KW, dk + kv_base + t * KW + D, 0.0f);
          std::fill(dv + kv_base + t * KW, dv + kv_base + t * KW + D, 0.0f);
        }
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const float* st = stats + attention_stats_floats(static_cast<int64_t>(b) * NH + h, 1, T);
          for (int t = 0; t < T; ++t) {
            const int64_t q_at = (static_cast<int64_t>(b) * T + t) * QW + static_cast<int64_t>(h) * D;
            const float* qt = q + q_at;
            // The forward's probabilities again, from its scores and the row's maximum and 1 / sum.
            scaled_scores(row.data(), qt, k + kv_base, KW, t, D, scale);
            for (int u = 0; u <= t; ++u) {
              row[static_cast<size_t>(u)] = std::exp(row[static_cast<size_t>(u)] - st[kAttentionStatsPerRow * t]) *
                                            st[kAttentionStatsPerRow * t + 1];
            }
            const float* d = dout + (static_cast<int64_t>(b) * T + t) * OW + static_cast<int64_t>(h) * D;
            // d(probabilities) and d(v)
            float dot_sum = 0.0f;
            for (int u = 0; u <= t; ++u) {
              const float* vu = v + kv_base + u * KW;
              float* dvu = dv + kv_base + u * KW;
              const float p = row[static_cast<size_t>(u)];
              float g = 0.0f;
              for (int i = 0; i < D; ++i) {
                g += d[i] * vu[i];
                dvu[i] += p * d[i];
              }
              datt[static_cast<size_t>(u)] = g;
              dot_sum += g * p;
            }
            // softmax backward, then d(q) and d(k) of the scaled scores
            float* dqt = dq + q_at;
            std::fill(dqt, dqt + D, 0.0f);
            for (int u = 0; u <= t; ++u) {
              const float dscore = row[static_cast<size_t>(u)] * (datt[static_cast<size_t>(u)] - dot_sum) * scale;
              const float* ku = k + kv_base + u * KW;
              float* dku = dk + kv_base + u * KW;
              for (int i = 0; i < D; ++i) {
                dqt[i] += dscore * ku[i];
                dku[i] += dscore * qt[i];
              }
            }
          }
        }
      }
    }
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

double head_forward_backward(float* dinp, float* dw, float* logits, const float* inp, const float* w,
                             const int32_t* targets, int N, int C, int V, float grad_scale, int64_t n_total) {
  double loss = 0.0;
  const float dscale = grad_scale / static_cast<float>(n_total);
  for (int r0 = 0; r0 < N; r0 += kHeadBlockRows) {
    const int rows = std::min(kHeadBlockRows, N - r0);
    const float* x = inp + static_cast<int64_t>(r0) * C;
    sgemm(false, true, rows, V, C, 1.0f, x, C, w, C, 0.0f, logits, V);
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
      sgemm(false, false, rows, C, V, 1.0f, logits, V, w, C, 0.0f, dinp + static_cast<int64_t>(r0) * C, C);
      sgemm(true, false, V, C, rows, 1.0f, logits, V, x, C, 1.0f, dw, C);
    }
  }
  return loss;
}

}  // namespace shardkit::model::cpu
