#include "model/gpt2/hf.hpp"

#include <cmath>
#include <optional>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::model::gpt2 {
namespace {

// What a GPT2Config may say that the family does not compute, refused by name: the family is
// GPT2LMHeadModel with the tanh approximation of GELU, LayerNorm's epsilon 1e-5, attention scaled by
// 1/sqrt(head size) alone and the output projection tied to wte. Dropout is not among them: shardkit
// trains without it (README), and inference does not use it.
void refuse_what_the_family_does_not_compute(const nlohmann::json& j, const std::string& where) {
  const auto boolean = [&](const char* key, bool computed) {
    const std::optional<bool> value = optional_boolean_field(j, key, where + ": model field", ErrorKind::kInvalidInput);
    if (value && *value != computed) {
      fail(ErrorKind::kInvalidInput, where + ": " + key + " is " + (computed ? "false" : "true") +
                                         "; the gpt2 family computes GPT2LMHeadModel with " + key + " " +
                                         (computed ? "true" : "false"));
    }
  };
  // transformers' names for 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
  const auto act = j.find("activation_function");
  if (act != j.end() && *act != "gelu_new" && *act != "gelu_pytorch_tanh" && *act != "gelu_fast") {
    fail(ErrorKind::kInvalidInput, where + ": activation_function is " + value_excerpt(*act) +
                                       ", expected \"gelu_new\" (GPT-2's tanh approximation of GELU)");
  }
  const auto eps = j.find("layer_norm_epsilon");
  if (eps != j.end() && !(eps->is_number() && std::abs(eps->get<double>() - 1e-5) <= 1e-12)) {
    fail(ErrorKind::kInvalidInput,
         where + ": layer_norm_epsilon is " + value_excerpt(*eps) + ", expected 1e-05 (the gpt2 family's LayerNorm)");
  }
  boolean("scale_attn_weights", true);
  boolean("scale_attn_by_inverse_layer_idx", false);
  boolean("tie_word_embeddings", true);
  boolean("add_cross_attention", false);
}

}  // namespace

nlohmann::json hf_config_json(const GptConfig& c, const std::string& torch_dtype) {
  // Dropouts are 0: shardkit trains without dropout, and inference does not use it.
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.n_positions},
          {"n_ctx", c.n_positions},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"layer_norm_epsilon", 1e-5},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"use_cache", true},
          {"bos_token_id", c.vocab_size - 1},
          {"eos_token_id", c.vocab_size - 1},
          {"tie_word_embeddings", true},
          {"torch_dtype", torch_dtype}};
}

GptConfig config_from_hf(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(ErrorKind::kInvalidInput, where + ": not a JSON object");
  if (j.contains("model_type") && j["model_type"] != "gpt2") {
    fail(ErrorKind::kInvalidInput, where + ": model_type is " + value_excerpt(j["model_type"]) + ", expected \"gpt2\"");
  }
  refuse_what_the_family_does_not_compute(j, where);
  nlohmann::json fields = j;
  if (!fields.contains("n_positions") && fields.contains("n_ctx")) fields["n_positions"] = fields["n_ctx"];
  GptConfig c = config_from_json(fields, where);
  const auto inner = j.find("n_inner");
  if (inner != j.end() && !inner->is_null() && *inner != 4 * c.n_embd) {
    fail(ErrorKind::kInvalidInput, where + ": n_inner other than 4 * n_embd is not supported");
  }
  c.name = where;
  return c;
}

std::optional<HfName> classify_hf_name(std::string_view name) {
  if (name == "lm_head.weight") return HfName{HfName::kTiedOutput, "transformer.wte.weight"};
  if (name.starts_with("optimizer.exp_avg.") || name.starts_with("optimizer.exp_avg_sq.")) {
    return HfName{HfName::kOptimizer, ""};
  }
  std::string_view rest = name;
  if (rest.starts_with("transformer.")) rest.remove_prefix(12);
  if (rest.starts_with("h.") && (rest.ends_with(".attn.bias") || rest.ends_with(".attn.masked_bias"))) {
    return HfName{HfName::kBuffer, ""};
  }
  // The rest must be a parameter name once prefixed; the caller checks it against the table.
  if (rest.empty()) return std::nullopt;
  return HfName{HfName::kParameter, "transformer." + std::string(rest)};
}

}  // namespace shardkit::model::gpt2
