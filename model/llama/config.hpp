// The Llama family's configuration, in the terms of Hugging Face's LlamaConfig, and its tensor table
// in LlamaForCausalLM's state-dict names and orientations (nn.Linear weights [out, in]).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/tensor_table.hpp"

namespace shardkit::model::llama {

// rope_scaling of type "llama3" (Llama 3.1 / 3.2): frequencies below the original context's band are
// divided by `factor`, those above it kept, and those between interpolated.
struct Llama3Scaling {
  double factor = 0;  // 0: no scaling
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int original_max_position_embeddings = 8192;
  bool operator==(const Llama3Scaling&) const = default;
};

struct LlamaConfig {
  int n_layer = 0;            // num_hidden_layers
  int hidden_size = 0;        // H
  int intermediate_size = 0;  // I, the SwiGLU width
  int n_head = 0;             // num_attention_heads
  int n_kv_head = 0;          // num_key_value_heads (grouped-query attention: n_head % n_kv_head == 0)
  int head_dim = 0;           // hidden_size / n_head unless the config says otherwise
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  Llama3Scaling rope_scaling;
  bool tie_word_embeddings = false;
  std::string name;  // preset or file, for messages

  bool same_architecture(const LlamaConfig& o) const noexcept {
    return n_layer == o.n_layer && hidden_size == o.hidden_size && intermediate_size == o.intermediate_size &&
           n_head == o.n_head && n_kv_head == o.n_kv_head && head_dim == o.head_dim && vocab_size == o.vocab_size &&
           max_position_embeddings == o.max_position_embeddings && rms_norm_eps == o.rms_norm_eps &&
           rope_theta == o.rope_theta && rope_scaling == o.rope_scaling && tie_word_embeddings == o.tie_word_embeddings;
  }
};

// Tensors of one decoder layer, in table order.
enum LayerTensor { kQ, kK, kV, kO, kGate, kUp, kDown, kInputNorm, kPostNorm, kTensorsPerLayer };

// model.embed_tokens.weight [V, H]; per layer i model.layers.i.{self_attn.q_proj.weight [NH*D, H],
// self_attn.k_proj.weight [NKV*D, H], self_attn.v_proj.weight [NKV*D, H], self_attn.o_proj.weight
// [H, NH*D], mlp.gate_proj.weight [I, H], mlp.up_proj.weight [I, H], mlp.down_proj.weight [H, I],
// input_layernorm.weight [H], post_attention_layernorm.weight [H]}; model.norm.weight [H]; and, when
// the head is not tied, lm_head.weight [V, H].
ckpt::TensorTable tensor_table(const LlamaConfig& config);
inline int layer_tensor(int layer, int k) {
  return 1 + kTensorsPerLayer * layer + k;
}
inline int final_norm_tensor(const LlamaConfig& c) {
  return 1 + kTensorsPerLayer * c.n_layer;
}
// The output projection: lm_head.weight, or embed_tokens.weight (tensor 0) when tied.
inline int head_tensor(const LlamaConfig& c) {
  return c.tie_word_embeddings ? 0 : final_norm_tensor(c) + 1;
}

// The rotary embedding's inverse frequencies (head_dim / 2 of them) as LlamaRotaryEmbedding computes
// them in fp32: theta^(-2i/D), then the llama3 scaling when configured.
std::vector<float> rope_inv_freq(const LlamaConfig& config);

// The rotation's cosines and sines for positions [0, seq_len): (seq_len, head_dim / 2) each, the
// angles t * inv_freq[i] formed in fp32 as Hugging Face forms them. The CPU and GPU models share them.
struct RopeTables {
  std::vector<float> cos, sin;
};
RopeTables rope_tables(const LlamaConfig& config, int seq_len);

// Validates sizes and ratios; `where` starts the error message (Error(kInvalidInput)).
void validate(const LlamaConfig& config, const std::string& where);

}  // namespace shardkit::model::llama
