// fp32 CPU kernels of GPT-2's own layers (learned positions, LayerNorm, Conv1D, gelu_new); the
// layers every family shares are in model/cpu/ops.hpp. Shapes use B (batch), T (sequence), C
// (channels), NH (heads), V (vocabulary); N = B * T rows. Buffers are row-major and contiguous.
// Backward kernels *accumulate* into parameter gradients (dw, db) and *overwrite* activation
// gradients unless documented otherwise. Loops run on OpenMP threads; matrix products go to sgemm.
#pragma once

#include <cstdint>

namespace shardkit::model::gpt2::ops {

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

// GELU, tanh approximation (Hugging Face's gelu_new).
void gelu_forward(float* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp) (overwritten).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

}  // namespace shardkit::model::gpt2::ops
