// fp32 CPU kernels of the Llama family's layers: token embedding, RMSNorm, rotary position
// embedding, SwiGLU, and bias-free nn.Linear products (weights [out, in]). Rows are N = B * T tokens;
// buffers row-major and contiguous. Backward kernels *accumulate* into parameter gradients and
// *overwrite* activation gradients unless documented otherwise.
#pragma once

#include <cstdint>

namespace shardkit::model::llama::ops {

// out (N, H) = embed[inputs]
void embedding_forward(float* out, const int32_t* inputs, const float* embed, int N, int H);
// dembed[inputs[n]] += dout[n]
void embedding_backward(float* dembed, const float* dout, const int32_t* inputs, int N, int H);

// out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), saved (N) for the backward pass.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int N, int H, float eps);
// dx (N, H) += ..., dweight (H) += ...
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, int N, int H);

// out (N, OUT) = in (N, IN) @ weight^T, weight (OUT, IN).
void linear_forward(float* out, const float* in, const float* weight, int N, int IN, int OUT);
// din (N, IN) = dout @ weight, added to din when accumulate; dweight (OUT, IN) += dout^T @ in.
void linear_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight, int N, int IN,
                     int OUT, bool accumulate);

// Rotates, in place, each head (heads of D channels per row, rows of B sequences of T) by the
// positions' angles: channel pairs (i, i + D/2) turn by t * inv_freq[i]. cos and sin (T, D/2) hold
// the angles' cosines and sines.
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int D);
// The inverse rotation (the gradient of rope_forward), in place.
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int D);

// out = silu(gate) * up over n elements.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// dgate, dup overwritten.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);

}  // namespace shardkit::model::llama::ops
