// GPT-2 exactly as Hugging Face's GPT2LMHeadModel computes it (learned position embeddings,
// pre-LayerNorm blocks with eps 1e-5, causal multi-head attention, MLP of width 4C with gelu_new,
// final LayerNorm, output projection tied to the token embedding; no dropout), in fp32 on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "model/cpu/ops.hpp"
#include "model/gpt2/config.hpp"
#include "model/model.hpp"

namespace shardkit::model::gpt2 {

class CpuGpt2 final : public CpuModel {
 public:
  // Activation buffers for batches of up to plan.batch sequences of plan.seq_len <= n_positions tokens,
  // for every block or (plan.checkpointing) for one block, recomputed in the backward pass.
  CpuGpt2(const GptConfig& config, const ActivationPlan& plan);

  // Mean next-token cross-entropy of a batch (B sequences of T tokens), no gradients.
  double forward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T) override;

  // Forward and backward: returns the mean cross-entropy and adds the gradient of
  // grad_scale * loss into the store's gradient buffers.
  double forward_backward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T,
                          float grad_scale, PassTimes* times = nullptr) override;

  // Bytes of activation buffers held.
  int64_t activation_bytes() const override;
  // Bytes of activation buffers a model of `config` holds for `plan`, known before any is allocated (in
  // double: a crafted configuration's figure may not fit an int64).
  static double activation_bytes(const GptConfig& config, const ActivationPlan& plan) noexcept;

 private:
  // Forward through the blocks into lnf_; gradients only when training.
  void forward_blocks(ParameterStore& params, const int32_t* inputs, int B, int T);
  // Block l's forward pass from its input into its layer's buffers (layer_slot(l)), the block's
  // parameters acquired; its output res3 only `with_output` (a recomputation has it already).
  void forward_block(ParameterStore& params, int l, int B, int T, bool with_output);
  // Where layer l's activations live: its own buffers, or the one block's buffers under checkpointing.
  size_t layer_slot(int l) const noexcept { return checkpointing_ ? 0 : static_cast<size_t>(l); }
  // Block l's input: the embeddings' output for l = 0, else block l - 1's output (kept in either mode).
  const float* block_input(int l) const noexcept;
  void backward_blocks(ParameterStore& params, const int32_t* inputs, int B, int T);
  // Multi-head attention over the packed q, k, v of rows of 3C.
  static cpu::AttentionShape attention_shape(const GptConfig& config, int B, int T) noexcept {
    const int NH = config.n_head, C = config.n_embd;
    return {B, T, NH, NH, C / NH, 3 * int64_t{C}, 3 * int64_t{C}};
  }

  GptConfig config_;
  int max_batch_;
  int max_seq_;
  bool checkpointing_;

  // Activations, per layer l with N = B*T rows (shapes for the maximum batch). With checkpointing the
  // per-layer buffers hold one layer (L' = 1) except res3, the block outputs, which are the inputs the
  // recomputation starts from (L' = L otherwise).
  std::vector<float> encoded_;                    // (N, C)  block 0 input
  std::vector<float> ln1_, ln1_mean_, ln1_rstd_;  // (L', N, C), (L', N), (L', N)
  std::vector<float> qkv_;                        // (L', N, 3C)
  std::vector<float> att_;                        // (L', B, NH, T, 2)  each attention row's maximum and 1 / sum
  std::vector<float> attention_ws_;               // the attention's scratch (cpu::attention_workspace_floats)
  std::vector<float> atty_;                       // (L', N, C)  attention output before its projection
  std::vector<float> res2_;                       // (L', N, C)  residual after attention
  std::vector<float> ln2_, ln2_mean_, ln2_rstd_;
  std::vector<float> fch_;                        // (L', N, 4C) before GELU
  std::vector<float> fch_gelu_;                   // (L', N, 4C)
  std::vector<float> res3_;                       // (L, N, C)  block output
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_;  // (N, C), (N), (N)
  std::vector<float> logits_;                     // (kHeadBlockRows, V)
  // Backward scratch:
  std::vector<float> dres_;      // (N, C) gradient flowing along the residual stream
  std::vector<float> dbuf_c_;    // (N, C)
  std::vector<float> dbuf_c2_;   // (N, C)
  std::vector<float> dbuf_3c_;   // (N, 3C)
  std::vector<float> dbuf_4c_;   // (N, 4C)
  std::vector<float> dbuf_4c2_;  // (N, 4C)
};

}  // namespace shardkit::model::gpt2
