// fp32 CPU kernels every family's CPU model shares: attention, residual additions and the output
// projection fused with the loss. N rows of C channels, V the vocabulary; buffers row-major and contiguous. Loops run
// on OpenMP threads; matrix products go to sgemm.
#pragma once

#include <cstdint>
#include <span>

namespace shardkit::model::cpu {

// Causal attention with grouped-query heads (NKV = NH: multi-head): rows of B sequences of T tokens;
// query head h (D channels at h * D of its row) reads kv head h / (NH / NKV). q, k, v and their
// gradients are read and written with their rows' strides, so that a packed QKV buffer serves too;
// out and dout are (N, NH * D).
struct AttentionShape {
  int B, T, NH, NKV, D;
  int64_t q_stride;   // elements between rows of q (and dq)
  int64_t kv_stride;  // elements between rows of k, v (and dk, dv)
};
// stats (B, NH, T, 2) saves each row's largest scaled score and 1 / its sum of exponentials, from
// which the backward pass recomputes the probabilities (the same bits): 2 floats a row where the
// probabilities themselves would be T.
inline constexpr int kAttentionStatsPerRow = 2;
// The statistics' floats for `batch` sequences of `seq` tokens and `heads` query heads.
constexpr int64_t attention_stats_floats(int64_t batch, int64_t heads, int64_t seq) noexcept {
  return batch * heads * seq * kAttentionStatsPerRow;
}
// The scratch the attention works in, held by the caller beside the activations: two blocks of scores
// a thread (a block of query rows against every key), for every thread the model's loops may use
// (omp_get_max_threads() when asked), and where query heads share a kv head, the dk and dv of every
// query head but a group's first (the backward pass runs every query head on its own and adds them up
// in head order). The attention runs on as many threads as the workspace it is given holds, at most;
// a workspace for a shape serves every shape of no more sequences, tokens and heads.
int64_t attention_workspace_floats(const AttentionShape& shape) noexcept;
void attention_forward(float* out, float* stats, const float* q, const float* k, const float* v,
                       const AttentionShape& shape, std::span<float> workspace);
// dq, dk, dv overwritten at their rows' positions (the rest of a packed buffer untouched).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                        const float* v, const float* stats, const AttentionShape& shape, std::span<float> workspace);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, int64_t n);
// y += x
void add_inplace(float* y, const float* x, int64_t n);

// The output projection (weight [V, C], y = x W^T: an untied head or the tied token embedding) fused with softmax
// cross-entropy, in blocks of rows so that no (N, V) logits matrix is ever held. Returns the summed (not averaged)
// cross-entropy over the N rows, in double. When dinp is non-null it also computes the gradient of grad_scale * (sum /
// N_total): dinp (N, C) overwritten, dw (V, C) accumulated. `logits` holds kHeadBlockRows * V floats.
inline constexpr int kHeadBlockRows = 64;
double head_forward_backward(float* dinp, float* dw, float* logits, const float* inp, const float* w,
                             const int32_t* targets, int N, int C, int V, float grad_scale, int64_t n_total);

}  // namespace shardkit::model::cpu
