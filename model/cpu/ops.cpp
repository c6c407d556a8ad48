#include "model/cpu/ops.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.hpp"
#include "base/vector_clones.hpp"
#include "model/cpu/gemm.hpp"
#include "model/cpu/vector_math.hpp"

namespace shardkit::model::cpu {

namespace {

// The attention takes this many query rows at a time: their scores against every key up to the
// block's last row are one matrix product into a kAttentionRows x T buffer a thread (the backward
// pass holds two), and so are the products that follow. The probabilities are never kept: each row's
// largest score and 1 / sum go to the statistics, and the backward pass recomputes the block's
// scores with the same call, hence the same bits.
inline constexpr int kAttentionRows = 64;

// One thread's share of the workspace: the scores and, in the backward pass, their gradients.
int64_t workspace_floats_per_thread(int64_t seq) noexcept {
  return 2 * static_cast<int64_t>(kAttentionRows) * seq;
}

// The backward pass's partial dk and dv: T x D floats each for every query head that is not the first
// of its group.
int64_t grad_partials_floats(const AttentionShape& a) noexcept {
  return 2 * static_cast<int64_t>(a.B) * (a.NH - a.NKV) * a.T * a.D;
}

// The threads `blocks` (the workspace's share for the score blocks) serves at sequence length T; an
// internal error if it serves none.
int workspace_threads(std::span<float> blocks, int T) {
  const int64_t threads = static_cast<int64_t>(blocks.size()) / workspace_floats_per_thread(T);
  if (threads < 1) {
    fail(ErrorKind::kInternal, "attention workspace of " + std::to_string(blocks.size()) + " floats is below the " +
                                   std::to_string(workspace_floats_per_thread(T)) + " one thread needs at " +
                                   std::to_string(T) + " tokens");
  }
  return static_cast<int>(std::min<int64_t>(threads, omp_get_max_threads()));
}

// Reductions in sixteen interleaved lanes, combined pairwise at the end: an order fixed by the code,
// not by the vector width, so every clone gives the same bits while the lanes run as vectors.
inline constexpr int kLanes = 16;
template <class T, int N>
T combine_lanes(T (&lane)[N]) {
  for (int width = N / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lane[j] += lane[j + width];
  }
  return lane[0];
}
// The sum of term(0) ... term(n - 1) in those lanes.
template <class Term>
inline float lane_sum(int n, Term term) {
  float lane[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) lane[j] += term(i + j);
  }
  for (int j = 0; i < n; ++i, ++j) lane[j] += term(i);
  return combine_lanes(lane);
}
inline float dot(const float* a, const float* b, int n) {
  return lane_sum(n, [=](int i) { return a[i] * b[i]; });
}
inline float sum_of(const float* a, int n) {
  return lane_sum(n, [=](int i) { return a[i]; });
}
// The largest of a[0..n) (n >= 1; the order cannot change a maximum).
inline float max_of(const float* a, int n) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, a[0]);
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) lane[j] = std::max(lane[j], a[i + j]);
  }
  for (int j = 0; i < n; ++i, ++j) lane[j] = std::max(lane[j], a[i]);
  return *std::max_element(lane, lane + kLanes);
}

// The rows [t0, t1) of one head: where its queries, keys and values start, and their row strides.
struct HeadBlock {
  const float* q;  // row 0 of the head's queries
  const float* k;  // row 0 of its kv head's keys
  const float* v;
  int64_t q_stride, kv_stride;
  int t0, t1, T, D;
  float scale;  // 1 / sqrt(D)
  int rows() const { return t1 - t0; }
};

// Scaled scores q_t . k_u / sqrt(D) of the block's rows t against keys u < t1 (row t - t0 of s,
// stride T; the entries u > t are computed and then masked by the callers).
void block_scores(float* s, const HeadBlock& h) {
  sgemm_serial(false, true, h.rows(), h.t1, h.D, h.scale, h.q + h.t0 * h.q_stride, static_cast<int>(h.q_stride), h.k,
               static_cast<int>(h.kv_stride), 0.0f, s, h.T);
}

// The block's scores into probabilities, in place: row t's exponentials of u <= t over their sum, the
// causal future zeroed; each row's largest score and 1 / sum into st (rows t0..t1-1).
SHARDKIT_VECTOR_CLONES void softmax_rows(float* s, float* st, const HeadBlock& h) {
  for (int t = h.t0; t < h.t1; ++t) {
    float* row = s + static_cast<int64_t>(t - h.t0) * h.T;
    const float max = max_of(row, t + 1);
#pragma omp simd
    for (int u = 0; u <= t; ++u) row[u] = exp_vec(row[u] - max);
    const float inv = 1.0f / sum_of(row, t + 1);
#pragma omp simd
    for (int u = 0; u <= t; ++u) row[u] *= inv;
    std::fill(row + t + 1, row + h.t1, 0.0f);
    st[kAttentionStatsPerRow * t] = max;
    st[kAttentionStatsPerRow * t + 1] = inv;
  }
}

// The backward pass's elementwise part: p's scores into the forward's probabilities (from st), and dp
// (d(probabilities) on entry) into the scaled scores' gradients p (dp - sum_u p dp) / sqrt(D), both with
// the causal future zeroed.
SHARDKIT_VECTOR_CLONES void softmax_backward_rows(float* __restrict p, float* __restrict dp, const float* st,
                                                  const HeadBlock& h) {
  for (int t = h.t0; t < h.t1; ++t) {
    float* pt = p + static_cast<int64_t>(t - h.t0) * h.T;
    float* dpt = dp + static_cast<int64_t>(t - h.t0) * h.T;
    const float max = st[kAttentionStatsPerRow * t], inv = st[kAttentionStatsPerRow * t + 1];
#pragma omp simd
    for (int u = 0; u <= t; ++u) pt[u] = exp_vec(pt[u] - max) * inv;
    std::fill(pt + t + 1, pt + h.t1, 0.0f);
    const float dot_sum = dot(pt, dpt, t + 1);
#pragma omp simd
    for (int u = 0; u <= t; ++u) dpt[u] = pt[u] * (dpt[u] - dot_sum) * h.scale;
    std::fill(dpt + t + 1, dpt + h.t1, 0.0f);
  }
}

// One row of logits: its cross-entropy, log(sum_v e^(x_v)) - x_target in double; the row is left
// holding e^(x_v - max) (it is scratch), and with `grad` d(loss)/d(logit) = (softmax - onehot) * dscale.
// The exponentials in float, vectorised; their sum in eight double lanes.
SHARDKIT_VECTOR_CLONES double row_cross_entropy(float* row, int V, int target, float dscale, bool grad) {
  constexpr int kSumLanes = 8;
  const float max = max_of(row, V);
  const float logit = row[target];
  double lane[kSumLanes] = {};
  int v = 0;
  for (; v + kSumLanes <= V; v += kSumLanes) {
#pragma omp simd
    for (int j = 0; j < kSumLanes; ++j) {
      row[v + j] = exp_vec(row[v + j] - max);
      lane[j] += static_cast<double>(row[v + j]);
    }
  }
  for (int j = 0; v < V; ++v, ++j) {
    row[v] = exp_vec(row[v] - max);
    lane[j] += static_cast<double>(row[v]);
  }
  const double sum = combine_lanes(lane);
  if (grad) {
    const auto scale = static_cast<float>(static_cast<double>(dscale) / sum);
#pragma omp simd
    for (int u = 0; u < V; ++u) row[u] *= scale;
    row[target] -= dscale;
  }
  return static_cast<double>(max) + std::log(sum) - static_cast<double>(logit);
}

}  // namespace

int64_t attention_workspace_floats(const AttentionShape& shape) noexcept {
  return grad_partials_floats(shape) + workspace_floats_per_thread(shape.T) * omp_get_max_threads();
}

void attention_forward(float* out, float* stats, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, std::span<float> workspace) {
  // Plain locals, not a structured binding: OpenMP regions may not name bindings before C++20's
  // rule reached every compiler (Clang 14 refuses them).
  const int B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, D = shape.D;
  const int64_t QW = shape.q_stride, KW = shape.kv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int group = NH / NKV;
  const int64_t OW = static_cast<int64_t>(NH) * D;
  const int threads = workspace_threads(workspace, T);
#pragma omp parallel num_threads(threads)
  {
    float* s = workspace.data() + omp_get_thread_num() * workspace_floats_per_thread(T);
    // Every block of every head on its own: the blocks are independent in the forward pass, so a
    // sequence of few heads still spreads over many threads. Dynamic, longest (last) blocks first,
    // as a causal block's work grows with its position.
    const int blocks = (T + kAttentionRows - 1) / kAttentionRows;
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        for (int j = blocks - 1; j >= 0; --j) {
          const int t0 = j * kAttentionRows, t1 = std::min(t0 + kAttentionRows, T);
          const int64_t kv_at = static_cast<int64_t>(b) * T * KW + static_cast<int64_t>(h / group) * D;
          const float* qh = q + static_cast<int64_t>(b) * T * QW + static_cast<int64_t>(h) * D;
          float* st = stats + attention_stats_floats(static_cast<int64_t>(b) * NH + h, 1, T);
          float* o = out + static_cast<int64_t>(b) * T * OW + static_cast<int64_t>(h) * D;
          const HeadBlock hb{qh, k + kv_at, v + kv_at, QW, KW, t0, t1, T, D, scale};
          block_scores(s, hb);
          softmax_rows(s, st, hb);
          // out_t = sum_u p_tu v_u
          sgemm_serial(false, false, hb.rows(), D, hb.t1, 1.0f, s, T, hb.v, static_cast<int>(KW), 0.0f, o + t0 * OW,
                       static_cast<int>(OW));
        }
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* stats, const AttentionShape& shape, std::span<float> workspace) {
  const int B = shape.B, T = shape.T, NH = shape.NH, NKV = shape.NKV, D = shape.D;
  const int64_t QW = shape.q_stride, KW = shape.kv_stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int group = NH / NKV;
  const int64_t OW = static_cast<int64_t>(NH) * D;
  // One task per (sequence, query head). A group's first head writes dk and dv; the others write
  // partials of their own, added to them afterwards in head order, so the bits do not depend on how
  // many threads ran.
  const int64_t head_floats = static_cast<int64_t>(T) * D;
  const auto partial_floats = static_cast<size_t>(grad_partials_floats(shape));
  if (workspace.size() < partial_floats) {
    fail(ErrorKind::kInternal, "attention workspace of " + std::to_string(workspace.size()) +
                                   " floats is below the grouped heads' " + std::to_string(partial_floats));
  }
  // Member m > 0 of kv head kvh's group in sequence b: its dk (T x D) and then its dv.
  auto partial_dk = [&](int b, int kvh, int member) {
    const int64_t slot = (static_cast<int64_t>(b) * NKV + kvh) * (group - 1) + member - 1;
    return workspace.data() + 2 * slot * head_floats;
  };
  const std::span<float> blocks = workspace.subspan(partial_floats);
  const int threads = workspace_threads(blocks, T);
#pragma omp parallel num_threads(threads)
  {
    float* p = blocks.data() + omp_get_thread_num() * workspace_floats_per_thread(T);
    float* dp = p + static_cast<int64_t>(kAttentionRows) * T;
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const int kvh = h / group, member = h % group;
        const int64_t kv_at = static_cast<int64_t>(b) * T * KW + static_cast<int64_t>(kvh) * D;
        float* hk = dk + kv_at;
        float* hv = dv + kv_at;
        int64_t ld = KW;
        if (member > 0) {
          hk = partial_dk(b, kvh, member);
          hv = hk + head_floats;
          ld = D;
        }
        for (int t = 0; t < T; ++t) {
          std::fill(hk + t * ld, hk + t * ld + D, 0.0f);
          std::fill(hv + t * ld, hv + t * ld + D, 0.0f);
        }
        const float* st = stats + attention_stats_floats(static_cast<int64_t>(b) * NH + h, 1, T);
        const int64_t q_at = static_cast<int64_t>(b) * T * QW + static_cast<int64_t>(h) * D;
        const float* d = dout + static_cast<int64_t>(b) * T * OW + static_cast<int64_t>(h) * D;
        for (int t0 = 0; t0 < T; t0 += kAttentionRows) {
          const HeadBlock hb{q + q_at, k + kv_at, v + kv_at, QW, KW, t0, std::min(t0 + kAttentionRows, T), T, D, scale};
          const int rows = hb.rows(), keys = hb.t1;
          const float* d_block = d + t0 * OW;
          block_scores(p, hb);
          // d(p_tu) = d(out_t) . v_u
          sgemm_serial(false, true, rows, keys, D, 1.0f, d_block, static_cast<int>(OW), hb.v, static_cast<int>(KW),
                       0.0f, dp, T);
          softmax_backward_rows(p, dp, st, hb);
          // d(q_t) = sum_u ds_tu k_u; d(k_u) += sum_t ds_tu q_t; d(v_u) += sum_t p_tu d(out_t)
          sgemm_serial(false, false, rows, D, keys, 1.0f, dp, T, hb.k, static_cast<int>(KW), 0.0f, dq + q_at + t0 * QW,
                       static_cast<int>(QW));
          sgemm_serial(true, false, keys, D, rows, 1.0f, dp, T, hb.q + t0 * QW, static_cast<int>(QW), 1.0f, hk,
                       static_cast<int>(ld));
          sgemm_serial(true, false, keys, D, rows, 1.0f, p, T, d_block, static_cast<int>(OW), 1.0f, hv,
                       static_cast<int>(ld));
        }
      }
    }
    if (group > 1) {
#pragma omp for collapse(3) schedule(static)
      for (int b = 0; b < B; ++b) {
        for (int kvh = 0; kvh < NKV; ++kvh) {
          for (int t = 0; t < T; ++t) {
            const int64_t row = (static_cast<int64_t>(b) * T + t) * KW + static_cast<int64_t>(kvh) * D;
            for (int member = 1; member < group; ++member) {
              const float* pk = partial_dk(b, kvh, member) + static_cast<int64_t>(t) * D;
              const float* pv = pk + head_floats;
#pragma omp simd
              for (int e = 0; e < D; ++e) {
                dk[row + e] += pk[e];
                dv[row + e] += pv[e];
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
      block_loss +=
          row_cross_entropy(logits + static_cast<int64_t>(r) * V, V, targets[r0 + r], dscale, dinp != nullptr);
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
