#include "model/gpt2/config.hpp"

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::model::gpt2 {
namespace {

struct Preset {
  const char* name;
  GptConfig config;
};

// gpt2-tiny is shardkit's own test size (byte-level vocabulary); the others are OpenAI's GPT-2 sizes.
const Preset kPresets[] = {
    {"gpt2-tiny", {2, 4, 128, 256, 64, "gpt2-tiny"}},
    {"gpt2", {12, 12, 768, 50257, 1024, "gpt2"}},
    {"gpt2-medium", {24, 16, 1024, 50257, 1024, "gpt2-medium"}},
    {"gpt2-large", {36, 20, 1280, 50257, 1024, "gpt2-large"}},
    {"gpt2-xl", {48, 25, 1600, 50257, 1024, "gpt2-xl"}},
};

int field(const nlohmann::json& j, const char* key, const std::string& where) {
  return static_cast<int>(
      integer_field(j, key, where + ": model field", 1, int64_t{1} << 30, ErrorKind::kInvalidInput));
}

}  // namespace

void validate(const GptConfig& c, const std::string& where) {
  auto bad = [&](const std::string& what) { fail(ErrorKind::kInvalidInput, where + ": " + what); };
  if (c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.vocab_size < 1 || c.n_positions < 1) {
    bad("n_layer, n_head, n_embd, vocab_size and n_positions must all be positive");
  }
  if (c.n_embd % c.n_head != 0) {
    bad("n_embd " + std::to_string(c.n_embd) + " is not divisible by n_head " + std::to_string(c.n_head));
  }
  if (c.n_layer > 1024 || c.n_embd > 65536 || c.vocab_size > (1 << 24) || c.n_positions > (1 << 20)) {
    bad("model dimensions are implausibly large");
  }
}

const std::vector<GptConfig>& presets() {
  static const std::vector<GptConfig> all = [] {
    std::vector<GptConfig> v;
    for (const Preset& p : kPresets) v.push_back(p.config);
    return v;
  }();
  return all;
}

nlohmann::json to_json(const GptConfig& c) {
  return {{"family", "gpt2"},           {"model_type", "gpt2"},         {"name", c.name},
          {"n_layer", c.n_layer},       {"n_head", c.n_head},           {"n_embd", c.n_embd},
          {"vocab_size", c.vocab_size}, {"n_positions", c.n_positions}, {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true}};
}

GptConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(ErrorKind::kInvalidInput, where + ": model configuration is not a JSON object");
  GptConfig c;
  c.n_layer = field(j, "n_layer", where);
  c.n_head = field(j, "n_head", where);
  c.n_embd = field(j, "n_embd", where);
  c.vocab_size = field(j, "vocab_size", where);
  c.n_positions = field(j, "n_positions", where);
  const auto name = j.find("name");
  if (name != j.end() && !(name->is_string() && name->get_ref<const std::string&>().size() <= 256)) {
    fail(ErrorKind::kInvalidInput,
         where + ": model field 'name' is " + value_excerpt(*name) + ", expected a string of at most 256 bytes");
  }
  c.name = name != j.end() ? name->get<std::string>() : where;
  validate(c, where);
  return c;
}

ckpt::TensorTable tensor_table(const GptConfig& c) {
  const int64_t C = c.n_embd;
  std::vector<ckpt::TensorInfo> t;
  t.reserve(static_cast<size_t>(2 + kTensorsPerBlock * c.n_layer + 2));
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back({std::move(name), std::move(shape), ckpt::DType::kF32});
  };
  add("transformer.wte.weight", {c.vocab_size, C});
  add("transformer.wpe.weight", {c.n_positions, C});
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {C, 3 * C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {C, 4 * C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {4 * C, C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("transformer.ln_f.weight", {C});
  add("transformer.ln_f.bias", {C});
  return ckpt::TensorTable(std::move(t));
}

std::vector<TensorGroup> groups(const GptConfig& c) {
  std::vector<TensorGroup> g = {{0, block_tensor(0, 0)}};
  for (int l = 0; l < c.n_layer; ++l) g.push_back({block_tensor(l, 0), block_tensor(l + 1, 0)});
  g.push_back({block_tensor(c.n_layer, 0), block_tensor(c.n_layer, 0) + 2});
  return g;
}

}  // namespace shardkit::model::gpt2
