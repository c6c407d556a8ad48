// What the CUDA backend needs of a family's GPU model (model/<family>/cuda/): the interface, the
// parameter store it works through, and the pieces every family's model shares (matrix products, the
// output projection's padded logits). gpu_family.hpp makes a model of any family.
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/cuda/block_outputs.hpp"
#include "model/cuda/cuda_common.hpp"
#include "model/cuda/encoder_backward.hpp"
#include "model/cuda/kernels.hpp"
#include "model/model.hpp"
#include "model/param_store.hpp"

namespace shardkit::model::cuda {

// The model's parameter store on a GPU: device pointers, parameters in T, gradients in fp32, and a wait
// for the stream that fails on a communication error instead of hanging.
template <typename T>
class GpuParamStore : public model::BasicParameterStore<T> {
 public:
  // Blocks until `stream` is done, failing rather than hanging when communication has failed.
  virtual void synchronize(cudaStream_t stream) = 0;
  // Whether tensors [first, last) sit back to back in table order in one buffer: their parameters
  // (their gradients) for as long as they are acquired (open). A model may then treat them as one
  // matrix. A property of the store's layout, never of where separate allocations happened to fall,
  // so that which products a run makes, and with them its bits, never depend on the allocator.
  virtual bool params_back_to_back(int first, int last) const = 0;
  virtual bool grads_back_to_back(int first, int last) const = 0;
  // Whether the gradients of `group`, as open_grads(group) has just opened them, hold nothing of the
  // step yet: then the model stores each element's first contribution of the pass (GradWrite::kStore:
  // a product with beta 0) and writes every element of every tensor of the group, zero where it has
  // nothing to add (an embedding's rows no token used), since nobody cleared the buffers. Stages 0-1:
  // the step's first micro-batch; stages 2-3: every micro-batch (each opens buffers of its own).
  virtual bool grads_fresh(int group) const = 0;
};

// kStore where a pass is the first to write a fresh group's gradients, else kAdd.
inline GradWrite first_write(bool fresh) {
  return fresh ? GradWrite::kStore : GradWrite::kAdd;
}

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

// The head's weight gradient, dwte (V x C, fp32) += (kStore: =) logits^T (V x rows, row stride ld) x
// (rows x C), in two products: the first rows a multiple of 64, then the rest. With V = 50257 rows as
// one product cuBLAS ran at about 510 TFLOP/s; split, at 870 (2.50 -> 1.45 ms on an H200 at 16 x 1024
// tokens).
template <typename T>
void head_weight_grad(cublasHandle_t handle, float* dwte, const T* logits, int ld, const T* x, int V, int C, int rows,
                      GradWrite write);

// Sizes a GPU model's activation buffer and counts its bytes into `total` (the model's
// activation_bytes()).
template <typename U>
void allocate_activation(DeviceBuffer<U>& buffer, size_t count, int64_t& total) {
  buffer.resize(count);
  total += static_cast<int64_t>(buffer.bytes());
}
// The bytes allocate_activation would count for `count` elements of the buffer `member` of a model.
template <typename Model, typename U>
int64_t buffer_bytes(DeviceBuffer<U> Model::*, size_t count) {
  return static_cast<int64_t>(count * sizeof(U));
}

// What a family's model holds for `plan` beside the buffers it lists (`listed` bytes): its block
// outputs (`blocks` of `width` values a token) and the embeddings' backward pass.
template <typename T>
ActivationBytes planned_model_activations(int64_t listed, int blocks, int width, int vocab_size,
                                          const model::ActivationPlan& plan) {
  const int tokens = plan.batch * plan.seq_len;
  ActivationBytes out =
      BlockOutputs<T>::bytes_for(blocks, static_cast<size_t>(tokens) * static_cast<size_t>(width), plan.inputs_on_host);
  out.device += listed + EncoderBackward::bytes_for(tokens, vocab_size);
  return out;
}

// A family's forward and backward passes on one GPU, in T with fp32 accumulation, for micro-batches of
// the batch and sequence length it was made for; with activation checkpointing, each block's forward
// pass rerun before its backward pass (model::ActivationPlan).
template <typename T>
class GpuModel {
 public:
  virtual ~GpuModel() = default;
  // Device memory of the activations (their page-locked host memory is in planned_activation_bytes).
  virtual int64_t activation_bytes() const = 0;

  // A micro-batch of device token ids (batch x seq_len): adds the gradient of grad_scale * loss into
  // the store's gradient buffers and returns the mean loss (the one host synchronisation of the pass).
  virtual double forward_backward(GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets,
                                  float grad_scale, model::PassTimes* times) = 0;
  // forward_backward in two halves: queue() puts the passes and the copy of the loss on the stream
  // without waiting (what a CUDA graph captures: the same kernels on the same memory every time, when
  // the store's buffers do not move); finish() waits for them and returns the mean loss.
  virtual void queue(GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets, float grad_scale,
                     model::PassTimes* times) = 0;
  virtual double finish(GpuParamStore<T>& params, model::PassTimes* times) = 0;
  // The forward pass alone (evaluation): the mean loss of a micro-batch, no gradient touched (the
  // store may have none).
  virtual double forward(GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets) = 0;
};

}  // namespace shardkit::model::cuda
