#include "model/llama/model.hpp"

#include "model/llama/cpu_model.hpp"
#include "model/llama/hf.hpp"

namespace shardkit::model::llama {
namespace {

std::vector<TensorGroup> make_groups(const LlamaConfig& c, int tensors) {
  // The embedding, each decoder layer, and the final norm with the untied head.
  std::vector<TensorGroup> g = {{0, 1}};
  for (int l = 0; l < c.n_layer; ++l) g.push_back({layer_tensor(l, 0), layer_tensor(l + 1, 0)});
  g.push_back({final_norm_tensor(c), tensors});
  return g;
}

class LlamaModel final : public Model {
 public:
  explicit LlamaModel(const LlamaConfig& c)
      : config_(c), table_(tensor_table(c)), groups_(make_groups(c, static_cast<int>(table_.size()))) {}

  const LlamaConfig& config() const noexcept { return config_; }

  const std::string& family() const override { return llama::family().name; }
  const std::string& name() const override { return config_.name; }
  int vocab_size() const override { return config_.vocab_size; }
  int max_seq_len() const override { return config_.max_position_embeddings; }
  int hidden_size() const override { return config_.hidden_size; }
  nlohmann::json to_json() const override { return llama::to_json(config_); }
  const ckpt::TensorTable& table() const override { return table_; }
  const std::vector<TensorGroup>& groups() const override { return groups_; }

  // Hugging Face's LlamaPreTrainedModel: embedding and every projection N(0, initializer_range = 0.02),
  // RMSNorm weights 1.
  InitRule init_rule(int tensor) const override {
    return is_norm(tensor) ? InitRule{InitRule::kOnes} : InitRule{InitRule::kNormal, 0.02f};
  }
  // The embedding, every projection and the untied head; no RMSNorm weight.
  bool decays(int tensor) const override { return !is_norm(tensor); }

  nlohmann::json hf_config(const std::string& torch_dtype) const override {
    return hf_config_json(config_, torch_dtype);
  }
  std::optional<HfName> classify_hf_name(std::string_view name) const override {
    return llama::classify_hf_name(config_, name);
  }

  double cpu_activation_bytes(const ActivationPlan& plan) const override {
    return CpuLlama::activation_bytes(config_, plan);
  }
  std::unique_ptr<CpuModel> make_cpu_model(const ActivationPlan& plan) const override {
    return std::make_unique<CpuLlama>(config_, plan);
  }

 private:
  // The RMSNorm weights: each layer's two and the final one.
  bool is_norm(int tensor) const {
    return tensor == final_norm_tensor(config_) ||
           (tensor >= 1 && tensor < final_norm_tensor(config_) && (tensor - 1) % kTensorsPerLayer >= kInputNorm);
  }

  LlamaConfig config_;
  ckpt::TensorTable table_;
  std::vector<TensorGroup> groups_;
};

}  // namespace

std::shared_ptr<const Model> make_model(const LlamaConfig& config) {
  validate(config, "model " + config.name);
  return std::make_shared<LlamaModel>(config);
}

const LlamaConfig* config_of(const Model& model) {
  const auto* m = dynamic_cast<const LlamaModel*>(&model);
  return m ? &m->config() : nullptr;
}

const Family& family() {
  static const Family f =
      describe_family<LlamaConfig>("llama", {"llama"}, presets(), make_model, config_from_json, config_from_hf);
  return f;
}

}  // namespace shardkit::model::llama
