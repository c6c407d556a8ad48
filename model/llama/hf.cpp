#include "model/llama/hf.hpp"

#include <cmath>

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::model::llama {
namespace {

LlamaConfig preset(const char* name, int layers, int hidden, int intermediate, int heads, int kv_heads, int vocab,
                   int positions, double eps, double theta, bool tied) {
  LlamaConfig c;
  c.name = name;
  c.n_layer = layers;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.head_dim = hidden / heads;
  c.vocab_size = vocab;
  c.max_position_embeddings = positions;
  c.rms_norm_eps = eps;
  c.rope_theta = theta;
  c.tie_word_embeddings = tied;
  return c;
}

// Reads the fields both forms share. `defaults`: absent fields take LlamaConfig's defaults (a Hugging
// Face file); otherwise every field must be present (shardkit's own form).
class Fields {
 public:
  Fields(const nlohmann::json& j, const std::string& where, bool defaults)
      : j_(j), where_(where), defaults_(defaults) {}

  int integer(const char* key, int64_t fallback) const {
    if (!j_.contains(key) || (defaults_ && j_[key].is_null())) {
      if (!defaults_) missing(key);
      return static_cast<int>(fallback);
    }
    return static_cast<int>(
        checked_integer(j_[key], where_ + ": model field", key, 1, int64_t{1} << 30, ErrorKind::kInvalidInput));
  }
  double number(const char* key, double fallback) const {
    if (!j_.contains(key)) {
      if (!defaults_) missing(key);
      return fallback;
    }
    return number_of(j_[key], key);
  }
  double number_of(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      fail(ErrorKind::kInvalidInput,
           where_ + ": model field '" + key + "' is " + value_excerpt(v) + ", expected a finite number");
    }
    return v.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!j_.contains(key)) {
      if (!defaults_) missing(key);
      return fallback;
    }
    return checked_boolean(j_[key], where_ + ": model field", key, ErrorKind::kInvalidInput);
  }
  [[noreturn]] void missing(const char* key) const {
    fail(ErrorKind::kInvalidInput, where_ + ": model field '" + key + "' is missing");
  }

  // rope_scaling (or transformers 5's rope_parameters, which also carries rope_theta).
  void rope(LlamaConfig& c) const {
    const nlohmann::json* scaling = nullptr;
    if (j_.contains("rope_parameters") && j_["rope_parameters"].is_object()) {
      scaling = &j_["rope_parameters"];
      if (scaling->contains("rope_theta")) c.rope_theta = number_of((*scaling)["rope_theta"], "rope_theta");
    } else if (j_.contains("rope_scaling")) {
      if (!j_["rope_scaling"].is_null()) scaling = &j_["rope_scaling"];
    } else if (!defaults_) {
      missing("rope_scaling");
    }
    if (!scaling) return;
    if (!scaling->is_object()) {
      fail(ErrorKind::kInvalidInput,
           where_ + ": rope_scaling is " + value_excerpt(*scaling) + ", expected an object or null");
    }
    const nlohmann::json& s = *scaling;
    const nlohmann::json type = s.contains("rope_type") ? s["rope_type"] : s.value("type", nlohmann::json("default"));
    if (type == "default") return;
    if (type != "llama3") {
      fail(ErrorKind::kInvalidInput,
           where_ + ": rope type " + value_excerpt(type) + " is not supported (\"default\" and \"llama3\" are)");
    }
    Fields f(s, where_ + ": rope_scaling", false);
    c.rope_scaling.factor = f.number("factor", 0);
    c.rope_scaling.low_freq_factor = f.number("low_freq_factor", 0);
    c.rope_scaling.high_freq_factor = f.number("high_freq_factor", 0);
    c.rope_scaling.original_max_position_embeddings = f.integer("original_max_position_embeddings", 0);
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
  bool defaults_;
};

LlamaConfig parse(const nlohmann::json& j, const std::string& where, bool hf) {
  if (!j.is_object()) fail(ErrorKind::kInvalidInput, where + ": model configuration is not a JSON object");
  const Fields f(j, where, hf);
  LlamaConfig c;
  // LlamaConfig's defaults (Llama 2 7B's shapes) where a Hugging Face file leaves a field out.
  c.n_layer = f.integer("num_hidden_layers", 32);
  c.hidden_size = f.integer("hidden_size", 4096);
  c.intermediate_size = f.integer("intermediate_size", 11008);
  c.n_head = f.integer("num_attention_heads", 32);
  c.n_kv_head = f.integer("num_key_value_heads", c.n_head);
  c.head_dim = f.integer("head_dim", c.hidden_size / c.n_head);
  c.vocab_size = f.integer("vocab_size", 32000);
  c.max_position_embeddings = f.integer("max_position_embeddings", 2048);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  f.rope(c);
  if (hf) {
    if (f.boolean("attention_bias", false) || f.boolean("mlp_bias", false)) {
      fail(ErrorKind::kInvalidInput, where + ": attention_bias / mlp_bias are set; the Llama family has no biases");
    }
    const nlohmann::json act = j.value("hidden_act", nlohmann::json("silu"));
    if (act != "silu") {
      fail(ErrorKind::kInvalidInput, where + ": hidden_act is " + value_excerpt(act) + ", expected \"silu\"");
    }
  }
  const auto name = j.find("name");
  if (!hf && name != j.end() && !(name->is_string() && name->get_ref<const std::string&>().size() <= 256)) {
    fail(ErrorKind::kInvalidInput,
         where + ": model field 'name' is " + value_excerpt(*name) + ", expected a string of at most 256 bytes");
  }
  c.name = !hf && name != j.end() ? name->get<std::string>() : where;
  validate(c, where);
  return c;
}

nlohmann::json rope_scaling_json(const LlamaConfig& c) {
  if (c.rope_scaling.factor == 0) return nullptr;
  return {{"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
}

}  // namespace

const std::vector<LlamaConfig>& presets() {
  static const std::vector<LlamaConfig> all = [] {
    // Shapes of the published models' config.json files; llama-tiny is shardkit's test size (byte-level
    // vocabulary, grouped-query attention).
    std::vector<LlamaConfig> v = {
        preset("llama-tiny", 2, 128, 344, 4, 2, 256, 64, 1e-5, 10000, false),
        preset("smollm-135m", 30, 576, 1536, 9, 3, 49152, 2048, 1e-5, 10000, true),
        preset("tinyllama-1.1b", 22, 2048, 5632, 32, 4, 32000, 2048, 1e-5, 10000, false),
        preset("llama-3.2-1b", 16, 2048, 8192, 32, 8, 128256, 131072, 1e-5, 500000, true),
        preset("llama-2-7b", 32, 4096, 11008, 32, 32, 32000, 4096, 1e-5, 10000, false),
    };
    v[3].rope_scaling = {32, 1, 4, 8192};
    return v;
  }();
  return all;
}

nlohmann::json to_json(const LlamaConfig& c) {
  return {{"family", "llama"},
          {"name", c.name},
          {"num_hidden_layers", c.n_layer},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.n_kv_head},
          {"head_dim", c.head_dim},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", rope_scaling_json(c)},
          {"tie_word_embeddings", c.tie_word_embeddings}};
}

LlamaConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  return parse(j, where, false);
}

LlamaConfig config_from_hf(const nlohmann::json& j, const std::string& where) {
  return parse(j, where, true);
}

nlohmann::json hf_config_json(const LlamaConfig& c, const std::string& torch_dtype) {
  // Dropout 0: shardkit trains without it. No bos/eos ids: they belong to the tokenizer, which
  // shardkit does not know.
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.n_kv_head},
          {"head_dim", c.head_dim},
          {"hidden_act", "silu"},
          {"max_position_embeddings", c.max_position_embeddings},
          {"initializer_range", 0.02},
          {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.rope_theta},
          {"rope_scaling", rope_scaling_json(c)},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"pretraining_tp", 1},
          {"use_cache", true},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"torch_dtype", torch_dtype}};
}

std::optional<HfName> classify_hf_name(const LlamaConfig& c, std::string_view name) {
  if (name == "lm_head.weight") {
    return c.tie_word_embeddings ? HfName{HfName::kTiedOutput, "model.embed_tokens.weight"}
                                 : HfName{HfName::kParameter, std::string(name)};
  }
  if (name.starts_with("optimizer.exp_avg.") || name.starts_with("optimizer.exp_avg_sq.")) {
    return HfName{HfName::kOptimizer, ""};
  }
  if (name.ends_with(".rotary_emb.inv_freq")) return HfName{HfName::kBuffer, ""};
  if (name.empty()) return std::nullopt;
  return HfName{HfName::kParameter, name.starts_with("model.") ? std::string(name) : "model." + std::string(name)};
}

}  // namespace shardkit::model::llama
