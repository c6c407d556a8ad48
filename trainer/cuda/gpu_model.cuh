// GPT-2 on one GPU: the same computation as trainer/gpt2.hpp (Hugging Face's GPT2LMHeadModel, no
// dropout), with activations and parameters in T (float, bf16 or fp16), fp32 accumulation, fp32
// parameter gradients, cuBLAS matrix products and the kernels of kernels.cuh. Parameters and
// gradients come from a GpuParamStore: the model knows nothing of ZeRO.
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/gpt2_config.hpp"
#include "trainer/cuda/cuda_common.hpp"
#include "trainer/cuda/encoder_backward.cuh"
#include "trainer/cuda/matmul.cuh"
#include "trainer/gpt2.hpp"
#include "trainer/param_store.hpp"

namespace shardkit::trainer::cuda {

// The GPU counterpart of ParameterStore: device pointers, parameters in T, gradients in fp32.
template <typename T>
class GpuParamStore {
 public:
  virtual ~GpuParamStore() = default;
  virtual void acquire(int group) = 0;
  virtual void release(int group) = 0;
  virtual const T* param(int tensor) const = 0;
  virtual void open_grads(int group) = 0;
  virtual float* grad(int tensor) = 0;
  virtual void close_grads(int group) = 0;
  // Blocks until `stream` is done, failing rather than hanging when communication has failed.
  virtual void synchronize(cudaStream_t stream) = 0;
};

// Row-major C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, A and B in T, C in TC (T or
// float), fp32 accumulation (tensor cores for bf16/fp16; true fp32, no TF32, for float).
template <typename T, typename TC>
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const T* a, int lda,
          const T* b, int ldb, float beta, TC* c, int ldc);

// The output projection's logits: rows padded to a multiple of 64 columns (with GPT-2's odd
// vocabulary, 50257, cuBLAS leaves its fast tensor-core kernels), computed for up to 2 GiB of rows at
// once (GPT-2 at 16 x 1024 tokens: all rows, 1.6 GB). In blocks of fewer rows the three products run
// at lower efficiency and the wte gradient is read and written once per block: 7 blocks of 256 MiB
// took 1.6x the time of one.
constexpr int padded_vocab(int vocab_size) {
  return (vocab_size + 63) / 64 * 64;
}
inline int head_block_rows(int padded_vocab, size_t element_bytes, int rows) {
  const size_t fit = (size_t{2} << 30) / (element_bytes * static_cast<size_t>(padded_vocab));
  return static_cast<int>(std::clamp<size_t>(fit, 1, static_cast<size_t>(rows)));
}

// The head's weight gradient, dwte (V x C, fp32) += logits^T (V x rows, row stride ld) x (rows x C),
// in two products: the first rows a multiple of 64, then the rest. With V = 50257 rows as one product
// cuBLAS ran at about 510 TFLOP/s; split, at 870 (2.50 -> 1.45 ms on an H200 at 16 x 1024 tokens).
template <typename T>
void head_weight_grad(cublasHandle_t handle, float* dwte, const T* logits, int ld, const T* x, int V, int C, int rows);

template <typename T>
class GpuGpt2 {
 public:
  GpuGpt2(const model::GptConfig& config, int batch, int seq_len, cublasHandle_t cublas, cudaStream_t stream);

  // Parameter groups: 0 = embeddings, 1..L = blocks, L+1 = final LayerNorm (as the CPU model).
  const std::vector<TensorGroup>& groups() const noexcept { return groups_; }
  int64_t activation_bytes() const noexcept { return activation_bytes_; }

  // A micro-batch of device token ids (batch x seq_len): adds the gradient of grad_scale * loss into
  // the store's gradient buffers and returns the mean loss (the one host synchronisation of the pass).
  double forward_backward(GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets, float grad_scale,
                          PassTimes* times);
  // forward_backward in two halves: queue() puts the passes and the copy of the loss on the stream
  // without waiting (what a CUDA graph captures: the same kernels on the same memory every time, when
  // the store's buffers do not move); finish() waits for them and returns the mean loss.
  void queue(GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets, float grad_scale,
             PassTimes* times);
  double finish(GpuParamStore<T>& params, PassTimes* times);

 private:
  void forward_blocks(GpuParamStore<T>& p, const int32_t* inputs);
  void backward_blocks(GpuParamStore<T>& p, const int32_t* inputs);
  int block_tensor(int layer, int k) const noexcept { return 2 + model::kTensorsPerBlock * layer + k; }

  model::GptConfig config_;
  int B_, S_;
  cublasHandle_t cublas_;
  cudaStream_t stream_;
  Matmul matmul_;
  EncoderBackward encoder_backward_;
  std::vector<TensorGroup> groups_;
  int head_rows_;  // rows of logits computed at once
  int logits_ld_;  // row stride of the logits (the vocabulary size rounded up)
  int64_t activation_bytes_ = 0;
  std::chrono::steady_clock::time_point backward_start_;  // PassTimes::backward_ms runs from here to finish()

  // Activations: per layer l and N = B*S rows.
  DeviceBuffer<T> encoded_, ln1_, qkv_, atty_, res2_, ln2_, fch_, fch_gelu_, res3_, lnf_, logits_, wte_padded_;
  DeviceBuffer<float> ln1_mean_, ln1_rstd_, ln2_mean_, ln2_rstd_, lnf_mean_, lnf_rstd_, lse_, losses_;
  // Backward scratch.
  DeviceBuffer<T> dres_, dbuf_c_, dbuf_c2_, dbuf_3c_, dbuf_4c2_;
  DeviceBuffer<float> delta_, scratch_;
  DeviceBuffer<double> loss_sum_;
  // Where the host reads it: pinned, so the copy is queued and the wait is wait_checking_nccl's (a
  // copy into pageable memory would block inside CUDA, where no NCCL watchdog can see a stall).
  PinnedBuffer<double> loss_host_;
};

}  // namespace shardkit::trainer::cuda
