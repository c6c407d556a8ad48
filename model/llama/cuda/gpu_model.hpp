// Llama on one GPU: the same computation as the CPU model (Hugging Face's LlamaForCausalLM), with
// activations and parameters in T (float, bf16 or fp16), fp32 accumulation, fp32 parameter
// gradients, cuBLAS matrix products, the family's kernels (model/llama/cuda/kernels.hpp) and the
// shared ones of model/cuda (grouped-query attention, the fused cross-entropy, the embedding's
// backward pass). Parameters and gradients come from a cuda::GpuParamStore: the model knows nothing of ZeRO.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/clock.hpp"
#include "model/cuda/encoder_backward.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/cuda/gpu_model.hpp"
#include "model/cuda/matmul.hpp"
#include "model/llama/config.hpp"

namespace shardkit::model::llama {

// Empty when the CUDA kernels support `config`'s shape, else why not.
std::string cuda_unsupported(const LlamaConfig& config);

// The family's registration with the CUDA backend (model/cuda/gpu_family.cpp lists it).
const cuda::GpuFamily& gpu_family();

template <typename T>
class GpuLlama final : public cuda::GpuModel<T> {
 public:
  GpuLlama(const LlamaConfig& config, const ActivationPlan& plan, cublasHandle_t cublas, cudaStream_t stream);

  int64_t activation_bytes() const noexcept override { return activation_bytes_; }
  // What activation_bytes() will be for this plan, before any allocation (and the host's share).
  static cuda::ActivationBytes planned_activation_bytes(const LlamaConfig& config, const ActivationPlan& plan);

  double forward_backward(cuda::GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets,
                          float grad_scale, PassTimes* times) override;
  void queue(cuda::GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets, float grad_scale,
             PassTimes* times) override;
  double finish(cuda::GpuParamStore<T>& params, PassTimes* times) override;
  double forward(cuda::GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets) override;

 private:
  // Every activation buffer with its element count, `buffer(&GpuLlama::member, count)`: what the
  // constructor allocates and planned_activation_bytes() adds up, listed once.
  template <typename F>
  static void activation_buffers(const LlamaConfig& config, const ActivationPlan& plan, F&& buffer);
  void forward_layers(cuda::GpuParamStore<T>& p, const int32_t* inputs);
  // Layer l's forward pass from `x` into its layer's buffers (layer_slot(l)), the layer's parameters
  // acquired; its output (into outputs_) only `with_output` (a recomputation has it already).
  void forward_layer(cuda::GpuParamStore<T>& p, int l, const T* x, bool with_output);
  // Where layer l's activations live: its own buffers, or the one layer's buffers under checkpointing.
  size_t layer_slot(int l) const noexcept { return checkpointing_ ? 0 : static_cast<size_t>(l); }
  // The head's loss (into loss_sum_) and, with `backward`, its gradient (into dxn_) over the final
  // norm's output.
  void head(cuda::GpuParamStore<T>& p, const int32_t* targets, float grad_scale, bool backward);
  void backward_layers(cuda::GpuParamStore<T>& p, const int32_t* inputs);

  LlamaConfig config_;
  int B_, S_;
  bool checkpointing_;
  int final_group_;  // the final norm's group (with the untied head)
  cublasHandle_t cublas_;
  cudaStream_t stream_;
  cuda::Matmul matmul_;
  cuda::EncoderBackward embedding_backward_;
  int head_rows_;  // rows of logits computed at once
  int logits_ld_;  // row stride of the logits (the vocabulary size rounded up)
  int64_t activation_bytes_ = 0;
  Clock::time_point backward_start_;  // PassTimes::backward_ms runs from here to finish()

  // The rotation's tables (S, D/2), uploaded once.
  cuda::DeviceBuffer<float> cos_, sin_;
  // Activations: per layer l (L' layers: L, or 1 under checkpointing) and N = B*S rows (qkv: N x
  // (NH + 2 NKV) D, each row q|k|v; atty: N x NH*D; gate_up: N x 2I, each row gate|up; act: N x I);
  // the layers' outputs (N, H) each in outputs_. q|k|v and gate|up are each one product's output
  // where the store keeps the weights back to back.
  cuda::DeviceBuffer<T> encoded_, xn1_, qkv_, atty_, res2_, xn2_, gate_up_, act_, xnf_, logits_, head_padded_;
  cuda::BlockOutputs<T> outputs_;
  cuda::DeviceBuffer<float> rstd1_, rstd2_, rstdf_, lse_, losses_;
  // Backward scratch.
  cuda::DeviceBuffer<T> dres_, dxn_, datty_, dqkv_, dgate_up_;  // dqkv_, dgate_up_ laid out as qkv_, gate_up_
  cuda::DeviceBuffer<float> delta_, scratch_;
  cuda::DeviceBuffer<double> loss_sum_;
  // Where the host reads it: pinned, so the copy is queued and the wait is the store's (see GpuGpt2).
  cuda::PinnedBuffer<double> loss_host_;
};

}  // namespace shardkit::model::llama
