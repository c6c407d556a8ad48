// The Llama family exactly as Hugging Face's LlamaForCausalLM computes it (token embedding, pre-RMSNorm
// decoder layers, rotary position embeddings, grouped-query causal attention, SwiGLU MLP, final
// RMSNorm, output projection tied or not; no biases, no dropout), in fp32 on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "model/cpu/ops.hpp"
#include "model/llama/config.hpp"
#include "model/model.hpp"

namespace shardkit::model::llama {

class CpuLlama final : public CpuModel {
 public:
  // Activation buffers for batches of up to plan.batch sequences of plan.seq_len <= max_position_embeddings
  // tokens, for every layer or (plan.checkpointing) for one layer, recomputed in the backward pass.
  CpuLlama(const LlamaConfig& config, const ActivationPlan& plan);

  double forward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T) override;
  double forward_backward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T,
                          float grad_scale, PassTimes* times = nullptr) override;
  int64_t activation_bytes() const override;
  static double activation_bytes(const LlamaConfig& config, const ActivationPlan& plan) noexcept;

 private:
  // Grouped-query attention over q, k and v in buffers of their own (rows of NH * D and NKV * D).
  static cpu::AttentionShape attention_shape(const LlamaConfig& c, int B, int T) noexcept {
    const int64_t D = c.head_dim;
    return {B, T, c.n_head, c.n_kv_head, c.head_dim, c.n_head * D, c.n_kv_head * D};
  }
  void forward_layers(ParameterStore& p, const int32_t* inputs, int B, int T);
  // Layer l's forward pass from its input into its layer's buffers (layer_slot(l)), the layer's
  // parameters acquired; its output res3 only `with_output` (a recomputation has it already).
  void forward_layer(ParameterStore& p, int l, int B, int T, bool with_output);
  // Where layer l's activations live: its own buffers, or the one layer's buffers under checkpointing.
  size_t layer_slot(int l) const noexcept { return checkpointing_ ? 0 : static_cast<size_t>(l); }
  // Layer l's input: the embedding's output for l = 0, else layer l - 1's output (kept in either mode).
  const float* layer_input(int l) const noexcept;
  void backward_layers(ParameterStore& p, const int32_t* inputs, int B, int T);
  // The head's loss over the final norm's output; its gradient into dxn_ when training.
  double head(ParameterStore& p, const int32_t* targets, int N, float grad_scale, bool train);

  LlamaConfig config_;
  int max_batch_, max_seq_;
  bool checkpointing_;
  int final_group_;
  std::vector<float> cos_, sin_;  // (max_seq, D/2)

  // Activations, per layer l with N = B*T rows (sizes for the largest batch). With checkpointing the
  // per-layer buffers hold one layer (L' = 1) except res3, the layer outputs, which are the inputs the
  // recomputation starts from (L' = L otherwise).
  std::vector<float> encoded_;          // (N, H) layer 0 input
  std::vector<float> xn1_, rstd1_;      // (L', N, H), (L', N)
  std::vector<float> q_, k_, v_;        // (L', N, NH*D), (L', N, NKV*D) x 2, after the rotation
  std::vector<float> att_;              // (L', B, NH, T, 2)  each attention row's maximum and 1 / sum
  std::vector<float> attention_ws_;     // the attention's scratch (cpu::attention_workspace_floats)
  std::vector<float> atty_;             // (L', N, NH*D) attention output before o_proj
  std::vector<float> res2_;             // (L', N, H) residual after attention
  std::vector<float> xn2_, rstd2_;      // (L', N, H), (L', N)
  std::vector<float> gate_, up_, act_;  // (L', N, I) each
  std::vector<float> res3_;             // (L, N, H) layer output
  std::vector<float> xnf_, rstdf_;      // (N, H), (N)
  std::vector<float> logits_;           // (kHeadBlockRows, V)
  // Backward scratch:
  std::vector<float> dres_, dxn_, dtmp_;   // (N, H)
  std::vector<float> dq_, datty_;          // (N, NH*D)
  std::vector<float> dk_, dv_;             // (N, NKV*D)
  std::vector<float> dact_, dgate_, dup_;  // (N, I)
};

}  // namespace shardkit::model::llama
