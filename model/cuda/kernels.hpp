// CUDA kernels every family's passes share, and the engine's reductions and casts, as host launchers that
// take an explicit stream (a family's own kernels live in model/<family>/cuda/, the optimizer's in
// trainer/cuda/optimizer_kernels.hpp). T is the compute type of activations and parameters: float,
// __nv_bfloat16 or __half; all arithmetic accumulates in fp32, and parameter gradients are fp32.
// Shapes: B batch, S sequence, C channels, NH heads, V vocabulary, N = B*S rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace shardkit::model::cuda {

// How a backward kernel puts a weight gradient into its fp32 buffer: added to what the buffer holds,
// or stored over it -- by the first writer of a buffer that holds nothing of the step yet
// (GpuParamStore::grads_fresh), which then needs no clearing beforehand.
enum class GradWrite { kAdd, kStore };

// The beta of a cuBLAS product writing a gradient: 1 adds to C; 0 stores, and cuBLAS then does not
// read C, so whatever it held (a NaN of an overflowed step included) cannot leak into the result.
constexpr float grad_beta(GradWrite write) {
  return write == GradWrite::kAdd ? 1.0f : 0.0f;
}

// out (N, OC) += bias;  dbias (OC) += (kStore: =) column sums of dout (N, OC), deterministic (the
// same sums in the same order on every run), with `scratch` of bias_scratch_floats(OC) floats.
template <typename T>
void bias_forward(T* out, const T* bias, int N, int OC, cudaStream_t st);
constexpr int kBiasBlocks = 128;  // row blocks: partial sums each
constexpr int64_t bias_scratch_floats(int OC) {
  return int64_t{kBiasBlocks} * OC;
}
template <typename T>
void bias_backward(float* dbias, const T* dout, int N, int OC, float* scratch, GradWrite write, cudaStream_t st);

// out[c] += (kStore: =) the sum of partial[r][c] over r in [0, rows), in one fixed order (the second
// step of a deterministic column sum: a family's kernels write per-block partial sums, this adds them).
void add_column_sums(float* out, const float* partial, int rows, int cols, GradWrite write, cudaStream_t st);

// GELU, tanh approximation (gelu_new); backward: dinp = dout * gelu'(inp)
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n, cudaStream_t st);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, cudaStream_t st);

// y += x
template <typename T>
void add_inplace(T* y, const T* x, int64_t n, cudaStream_t st);

// Causal attention with grouped-query heads (NKV = NH: multi-head), rows of B sequences of S tokens:
// query head h (HS channels at h * HS of its row of q) reads kv head h / (NH / NKV) of k and v. q, k,
// v and their gradients are read and written with their rows' strides, so that GPT-2's packed qkv
// serves as well as separate buffers; out and dout are (B, S, NH * HS), lse and delta (B, NH, S).
struct AttentionShape {
  int B, S, NH, NKV, HS;
  int64_t ld_q;   // elements between rows of q (and dq)
  int64_t ld_kv;  // elements between rows of k, v (and dk, dv)
};

// Memory-efficient: no (S x S) matrix is stored, only lse, the log-sum-exp of each query's scores,
// for the backward pass, which recomputes the probabilities tile by tile. Head size 32, 64 or 128.
// 16-bit types run on the kernels SHARDKIT_ATTENTION picks (attention_kernels.hpp).
template <typename T>
void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v, const AttentionShape& shape,
                       cudaStream_t st);
// dq, dk, dv overwritten at their rows' positions (the rest of a packed buffer untouched); delta is
// scratch. dk and dv sum a kv head's query heads in a fixed order (no atomics).
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, float* delta, const T* dout, const T* out, const T* q, const T* k,
                        const T* v, const float* lse, const AttentionShape& shape, cudaStream_t st);
// Softmax cross-entropy of logits (rows, V; row stride ld >= V): losses[r] = logsumexp - logit[target];
// with `backward`, logits are replaced by (softmax - onehot) * dscale.
template <typename T>
void softmax_cross_entropy(T* logits, int64_t ld, float* losses, const int32_t* targets, int rows, int V, float dscale,
                           bool backward, cudaStream_t st);

// out = (T) in
template <typename T>
void cast_from_float(T* out, const float* in, int64_t n, cudaStream_t st);

// out[0] = sum(x^2), or sum(x), in double, the same bits on every run; out has kSumScratch doubles
// (out[1..] holds the blocks' partial sums).
constexpr int kSumBlocks = 1024;
constexpr int kSumScratch = 1 + kSumBlocks;
void sum_squares(double* out, const float* x, int64_t n, cudaStream_t st);
void sum_floats(double* out, const float* x, int64_t n, cudaStream_t st);

// host[0..n) = device[0..n), `host` page-locked (cudaMallocHost: mapped into the device's address
// space), written by a kernel's stores over the bus rather than by a copy engine. A copy engine runs
// the copies of one direction one after another, so the few bytes a step reads back (its loss, its
// gradient norm) would otherwise wait behind a checkpoint snapshot's gigabytes draining to host memory.
void read_back(double* host, const double* device, int n, cudaStream_t st);

// Holds `st` for `ms` milliseconds of device time (a fault test's slow copy).
void delay_stream(cudaStream_t st, double ms);

}  // namespace shardkit::model::cuda
