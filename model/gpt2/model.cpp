#include "model/gpt2/model.hpp"

#include <cmath>

#include "model/gpt2/cpu_model.hpp"
#include "model/gpt2/hf.hpp"

namespace shardkit::model::gpt2 {
namespace {

class Gpt2Model final : public Model {
 public:
  explicit Gpt2Model(const GptConfig& c) : config_(c), table_(tensor_table(c)), groups_(gpt2::groups(c)) {}

  const GptConfig& config() const noexcept { return config_; }

  const std::string& family() const override { return gpt2::family().name; }
  const std::string& name() const override { return config_.name; }
  int vocab_size() const override { return config_.vocab_size; }
  int max_seq_len() const override { return config_.n_positions; }
  int hidden_size() const override { return config_.n_embd; }
  nlohmann::json to_json() const override { return gpt2::to_json(config_); }
  const ckpt::TensorTable& table() const override { return table_; }
  const std::vector<TensorGroup>& groups() const override { return groups_; }

  // Hugging Face's GPT-2 initialisation: weights N(0, 0.02), the residual projections (attn.c_proj and
  // mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1.
  InitRule init_rule(int tensor) const override {
    if (tensor < block_tensor(0, 0)) return {InitRule::kNormal, 0.02f};
    const int k = (tensor - block_tensor(0, 0)) % kTensorsPerBlock;
    if (tensor >= block_tensor(config_.n_layer, 0)) return {k == 0 ? InitRule::kOnes : InitRule::kZeros};  // ln_f
    switch (k) {
      case 0:  // ln_1.weight
      case 6:  // ln_2.weight
        return {InitRule::kOnes};
      case 2:  // attn.c_attn.weight
      case 8:  // mlp.c_fc.weight
        return {InitRule::kNormal, 0.02f};
      case 4:   // attn.c_proj.weight
      case 10:  // mlp.c_proj.weight
        return {InitRule::kNormal, 0.02f / std::sqrt(2.0f * static_cast<float>(config_.n_layer))};
      default:  // biases
        return {InitRule::kZeros};
    }
  }

  // The embeddings (wte, wpe) and the four matrices of each block; no bias or LayerNorm weight.
  bool decays(int tensor) const override {
    if (tensor < block_tensor(0, 0)) return true;
    if (tensor >= block_tensor(config_.n_layer, 0)) return false;  // ln_f
    switch ((tensor - block_tensor(0, 0)) % kTensorsPerBlock) {
      case kQkvW:
      case kAttProjW:
      case kFcW:
      case kFcProjW:
        return true;
      default:
        return false;
    }
  }

  nlohmann::json hf_config(const std::string& torch_dtype) const override {
    return hf_config_json(config_, torch_dtype);
  }
  std::optional<HfName> classify_hf_name(std::string_view name) const override { return gpt2::classify_hf_name(name); }

  double cpu_activation_bytes(const ActivationPlan& plan) const override {
    return CpuGpt2::activation_bytes(config_, plan);
  }
  std::unique_ptr<CpuModel> make_cpu_model(const ActivationPlan& plan) const override {
    return std::make_unique<CpuGpt2>(config_, plan);
  }

 private:
  GptConfig config_;
  ckpt::TensorTable table_;
  std::vector<TensorGroup> groups_;
};

}  // namespace

std::shared_ptr<const Model> make_model(const GptConfig& config) {
  validate(config, "model " + config.name);
  return std::make_shared<Gpt2Model>(config);
}

const GptConfig* config_of(const Model& model) {
  const auto* m = dynamic_cast<const Gpt2Model*>(&model);
  return m ? &m->config() : nullptr;
}

const Family& family() {
  static const Family f =
      describe_family<GptConfig>("gpt2", {"gpt2"}, presets(), make_model, config_from_json, config_from_hf);
  return f;
}

}  // namespace shardkit::model::gpt2
