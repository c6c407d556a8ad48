// GPT-2 on one GPU: the same computation as the CPU model (Hugging Face's GPT2LMHeadModel, no
// dropout), with activations and parameters in T (float, bf16 or fp16), fp32 accumulation, fp32
// parameter gradients, cuBLAS matrix products and the kernels of model/cuda. Parameters and
// gradients come from a cuda::GpuParamStore: the model knows nothing of ZeRO.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "base/clock.hpp"
#include "model/cuda/encoder_backward.hpp"
#include "model/cuda/gpu_family.hpp"
#include "model/cuda/gpu_model.hpp"
#include "model/cuda/matmul.hpp"
#include "model/gpt2/config.hpp"

namespace shardkit::model::gpt2 {

// Empty when the CUDA kernels support `config`'s shape, else why not.
std::string cuda_unsupported(const GptConfig& config);

// The family's registration with the CUDA backend (model/cuda/gpu_family.cpp lists it).
const cuda::GpuFamily& gpu_family();

template <typename T>
class GpuGpt2 final : public cuda::GpuModel<T> {
 public:
  GpuGpt2(const GptConfig& config, const ActivationPlan& plan, cublasHandle_t cublas, cudaStream_t stream);

  // Parameter groups: 0 = embeddings, 1..L = blocks, L+1 = final LayerNorm (as the CPU model).
  const std::vector<TensorGroup>& groups() const noexcept { return groups_; }
  int64_t activation_bytes() const noexcept { return activation_bytes_; }
  // What activation_bytes() will be for this plan, before any allocation (and the host's share).
  static cuda::ActivationBytes planned_activation_bytes(const GptConfig& config, const ActivationPlan& plan);

  // A micro-batch of device token ids (batch x seq_len): adds the gradient of grad_scale * loss into
  // the store's gradient buffers and returns the mean loss (the one host synchronisation of the pass).
  double forward_backward(cuda::GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets,
                          float grad_scale, PassTimes* times);
  // forward_backward in two halves: queue() puts the passes and the copy of the loss on the stream
  // without waiting (what a CUDA graph captures: the same kernels on the same memory every time, when
  // the store's buffers do not move); finish() waits for them and returns the mean loss.
  void queue(cuda::GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets, float grad_scale,
             PassTimes* times);
  double finish(cuda::GpuParamStore<T>& params, PassTimes* times);
  double forward(cuda::GpuParamStore<T>& params, const int32_t* inputs, const int32_t* targets) override;

 private:
  // Every activation buffer with its element count, `buffer(&GpuGpt2::member, count)`: what the
  // constructor allocates and planned_activation_bytes() adds up, listed once.
  template <typename F>
  static void activation_buffers(const GptConfig& config, const ActivationPlan& plan, F&& buffer);
  void forward_blocks(cuda::GpuParamStore<T>& p, const int32_t* inputs);
  // Block l's forward pass from `input` into its layer's buffers (layer_slot(l)), the block's parameters
  // acquired; its output (into outputs_) only `with_output` (a recomputation has it already).
  void forward_block(cuda::GpuParamStore<T>& p, int l, const T* input, bool with_output);
  // Where layer l's activations live: its own buffers, or the one block's buffers under checkpointing.
  size_t layer_slot(int l) const noexcept { return checkpointing_ ? 0 : static_cast<size_t>(l); }
  // The output projection (tied to wte) fused with the loss (into loss_sum_), in blocks of rows; with
  // `backward` also its gradients (dx into dbuf_c_, wte's into the store).
  void head(cuda::GpuParamStore<T>& p, const int32_t* targets, float grad_scale, bool backward);
  void backward_blocks(cuda::GpuParamStore<T>& p, const int32_t* inputs);

  GptConfig config_;
  int B_, S_;
  bool checkpointing_;
  cublasHandle_t cublas_;
  cudaStream_t stream_;
  cuda::Matmul matmul_;
  cuda::EncoderBackward encoder_backward_;
  std::vector<TensorGroup> groups_;
  int head_rows_;  // rows of logits computed at once
  int logits_ld_;  // row stride of the logits (the vocabulary size rounded up)
  int64_t activation_bytes_ = 0;
  Clock::time_point backward_start_;  // PassTimes::backward_ms runs from here to finish()

  // Activations: per layer l (L' layers: L, or 1 under checkpointing) and N = B*S rows; the blocks'
  // outputs (N, C) each in outputs_.
  cuda::DeviceBuffer<T> encoded_, ln1_, qkv_, atty_, res2_, ln2_, fch_, fch_gelu_, lnf_, logits_, wte_padded_;
  cuda::BlockOutputs<T> outputs_;
  cuda::DeviceBuffer<float> ln1_mean_, ln1_rstd_, ln2_mean_, ln2_rstd_, lnf_mean_, lnf_rstd_, lse_, losses_;
  // Backward scratch.
  cuda::DeviceBuffer<T> dres_, dbuf_c_, dbuf_c2_, dbuf_3c_, dbuf_4c2_;
  cuda::DeviceBuffer<float> delta_, scratch_;
  cuda::DeviceBuffer<double> loss_sum_;
  // Where the host reads it: pinned, so the copy is queued and the wait is wait_checking_nccl's (a
  // copy into pageable memory would block inside CUDA, where no NCCL watchdog can see a stall).
  cuda::PinnedBuffer<double> loss_host_;
};

}  // namespace shardkit::model::gpt2
