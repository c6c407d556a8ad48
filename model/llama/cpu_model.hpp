// The Llama family exactly as Hugging Face's LlamaForCausalLM computes it (token embedding, pre-RMSNorm
// decoder layers, rotary position embeddings, grouped-query causal attention, SwiGLU MLP, final
// RMSNorm, output projection tied or not; no biases, no dropout), in fp32 on the CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "model/llama/config.hpp"
#include "model/model.hpp"

namespace shardkit::model::llama {

class CpuLlama final : public CpuModel {
 public:
  // Activation buffers for batches of up to `batch` sequences of `seq_len` <= max_position_embeddings.
  CpuLlama(const LlamaConfig& config, int batch, int seq_len);

  double forward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T) override;
  double forward_backward(ParameterStore& params, const int32_t* inputs, const int32_t* targets, int B, int T,
                          float grad_scale, PassTimes* times = nullptr) override;
  int64_t activation_bytes() const override;
  static double activation_bytes(const LlamaConfig& config, int batch, int seq_len) noexcept;

 private:
  void forward_layers(ParameterStore& p, const int32_t* inputs, int B, int T);
  void backward_layers(ParameterStore& p, const int32_t* inputs, int B, int T);
  // The head's loss over the final norm's output; its gradient into dxn_ when training.
  double head(ParameterStore& p, const int32_t* targets, int N, float grad_scale, bool train);

  LlamaConfig config_;
  int max_batch_, max_seq_;
  int final_group_;
  std::vector<float> cos_, sin_;  // (max_seq, D/2)

  // Activations, per layer l with N = B*T rows (sizes for the largest batch):
  std::vector<float> encoded_;          // (N, H) layer 0 input
  std::vector<float> xn1_, rstd1_;      // (L, N, H), (L, N)
  std::vector<float> q_, k_, v_;        // (L, N, NH*D), (L, N, NKV*D) x 2, after the rotation
  std::vector<float> att_;              // (L, B, NH, T, T)
  std::vector<float> atty_;             // (L, N, NH*D) attention output before o_proj
  std::vector<float> res2_;             // (L, N, H) residual after attention
  std::vector<float> xn2_, rstd2_;      // (L, N, H), (L, N)
  std::vector<float> gate_, up_, act_;  // (L, N, I) each
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
