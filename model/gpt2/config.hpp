// The GPT-2 family's configuration: presets, JSON model files, the tensor table in Hugging Face's
// GPT2LMHeadModel names and orientations (Conv1D weights [in, out]; lm_head tied to wte, not listed),
// and its parameter groups.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/tensor_table.hpp"
#include "model/param_store.hpp"

namespace shardkit::model::gpt2 {

struct GptConfig {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;
  int n_positions = 0;
  std::string name;  // preset name or model file, for logs

  int head_dim() const noexcept { return n_embd / n_head; }
  bool operator==(const GptConfig& o) const noexcept {
    return n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd && vocab_size == o.vocab_size &&
           n_positions == o.n_positions;
  }
};

// The presets: gpt2-tiny (tests), gpt2, gpt2-medium, gpt2-large, gpt2-xl.
const std::vector<GptConfig>& presets();

// Validates sizes (positive, n_embd divisible by n_head, bounded); `where` starts the error message.
void validate(const GptConfig& config, const std::string& where);

nlohmann::json to_json(const GptConfig& config);
// From to_json()'s form (a manifest's "model" object, or a JSON model file with n_layer, n_head,
// n_embd, vocab_size, n_positions).
GptConfig config_from_json(const nlohmann::json& j, const std::string& where);

// Tensors of one transformer block, in table order.
enum BlockTensor { kLn1W, kLn1B, kQkvW, kQkvB, kAttProjW, kAttProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };
inline constexpr int kTensorsPerBlock = 12;
inline constexpr int kWte = 0;
inline constexpr int kWpe = 1;

// The tensor table: transformer.wte.weight [V, C], transformer.wpe.weight [P, C], for each block i the
// 12 tensors transformer.h.i.{ln_1.weight, ln_1.bias, attn.c_attn.weight [C, 3C], attn.c_attn.bias,
// attn.c_proj.weight [C, C], attn.c_proj.bias, ln_2.weight, ln_2.bias, mlp.c_fc.weight [C, 4C],
// mlp.c_fc.bias, mlp.c_proj.weight [4C, C], mlp.c_proj.bias}, transformer.ln_f.weight, .bias.
ckpt::TensorTable tensor_table(const GptConfig& config);
inline int block_tensor(int layer, int k) {
  return 2 + kTensorsPerBlock * layer + k;
}

// The parameter groups: the embeddings (wte, wpe), each block, the final LayerNorm.
std::vector<TensorGroup> groups(const GptConfig& config);

}  // namespace shardkit::model::gpt2
