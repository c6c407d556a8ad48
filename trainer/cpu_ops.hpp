// fp32 CPU kernels of the GPT-2 forward and backward passes. Shapes use B (batch), T (sequence),
// C (channels), NH (heads), V (vocabulary); N = B * T rows. Buffers are row-major and contiguous.
// Backward kernels *accumulate* into parameter gradients (dw, db) and *overwrite* activation
// gradients unless documented otherwise. Loops run on OpenMP threads; matrix products go to sgemm.
#pragma once

#include <cstdint>

namespace shardkit::trainer::ops {

// out (N, C) = wte[inputs] + wpe[t]
void encoder_forward(float* out, const int32_t* inputs, const float* wte, const float* wpe, int B, int T, int C);
// dwte[inputs[n]] += dout[n], dwpe[t] += dout[b, t]
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inputs, int B, int T, int C);

// LayerNorm over C with eps 1e-5; mean, rstd (N) are saved for the backward pass.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C);
// dinp (N, C) += ..., dweight, dbias (C) += ...
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// Conv1D: out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC);
// dinp (N, IC) = dout @ weight^T (overwritten); dweight (IC, OC) += inp^T @ dout; dbias (OC) += colsum(dout).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

// Causal self-attention. qkv (B, T, 3C) holds q, k, v; att (B, NH, T, T) saves the probabilities
// (zero above the diagonal); out (B, T, C).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv (B, T, 3C) overwritten.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

// GELU, tanh approximation (Hugging Face's gelu_new).
void gelu_forward(float* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp) (overwritten).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, int64_t n);
// y += x
void add_inplace(float* y, const float* x, int64_t n);

// The output projection tied to wte, fused with softmax cross-entropy, in blocks of rows so that no
// (N, V) logits matrix is ever held. Returns the summed (not averaged) cross-entropy over the N rows,
// in double. When dinp is non-null it also computes the gradient of grad_scale * (sum / N_total):
// dinp (N, C) overwritten, dwte (V, C) accumulated. `logits` holds kHeadBlockRows * V floats.
inline constexpr int kHeadBlockRows = 64;
double head_forward_backward(float* dinp, float* dwte, float* logits, const float* inp, const float* wte,
                             const int32_t* targets, int N, int C, int V, float grad_scale, int64_t n_total);

}  // namespace shardkit::trainer::ops
