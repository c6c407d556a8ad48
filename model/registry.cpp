#include "model/registry.hpp"

#include <filesystem>

#include "base/error.hpp"
#include "base/json_input.hpp"
#include "model/gpt2/model.hpp"
#include "model/llama/model.hpp"

namespace shardkit::model {
namespace {

// Manifests and model files from before families existed hold GPT-2's fields only.
const Family& original_family() {
  return gpt2::family();
}

const Family* find_family(const std::string& name) {
  for (const Family* f : families()) {
    if (f->name == name) return f;
  }
  return nullptr;
}

std::string family_list() {
  std::string names;
  for (const Family* f : families()) names += (names.empty() ? "" : ", ") + f->name;
  return names;
}

const Family& family_field(const nlohmann::json& j, const std::string& where, ErrorKind kind) {
  const nlohmann::json& f = j["family"];
  const Family* family = f.is_string() ? find_family(f.get<std::string>()) : nullptr;
  if (!family) {
    fail(kind, where + ": model family " + value_excerpt(f) + " is not one of " + family_list());
  }
  return *family;
}

}  // namespace

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {&gpt2::family(), &llama::family()};
  return all;
}

std::string preset_list() {
  std::string names;
  for (const Family* f : families()) {
    for (const std::string& p : f->presets) names += (names.empty() ? "" : ", ") + p;
  }
  return names;
}

std::shared_ptr<const Model> resolve_model(const std::string& model) {
  for (const Family* f : families()) {
    for (const std::string& p : f->presets) {
      if (p == model) return f->preset(p);
    }
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model, ec)) {
    fail(ErrorKind::kInvalidInput,
         "model '" + model + "' is neither a preset (" + preset_list() + ") nor a JSON model file");
  }
  const nlohmann::json j = read_json_file(model, json_limits::kConfig, ErrorKind::kInvalidInput);
  if (!j.is_object()) fail(ErrorKind::kInvalidInput, model + ": not a JSON object");
  if (j.contains("family")) return family_field(j, model, ErrorKind::kInvalidInput).from_json(j, model);
  if (j.contains("model_type")) return model_from_hf_config(j, model);
  return original_family().from_json(j, model);
}

bool is_external(const nlohmann::json& manifest_model) {
  return manifest_model.is_object() && manifest_model.value("family", nlohmann::json()) == kExternalFamily;
}

std::shared_ptr<const Model> model_from_manifest(const nlohmann::json& model, const std::string& where) {
  if (!model.is_object()) fail(ErrorKind::kCorrupt, where + ": the model is not a JSON object");
  if (is_external(model)) {
    fail(ErrorKind::kInvalidInput,
         where + ": holds the tensors of a model shardkit has no family for (" + family_list() +
             "): it can be resharded, consolidated and exported; to train or evaluate it, import it again with "
             "--model");
  }
  const Family& family = model.contains("family") ? family_field(model, where, ErrorKind::kCorrupt) : original_family();
  try {
    return family.from_json(model, where);
  } catch (const Error& e) {
    // A manifest's model is written by shardkit: one that does not parse is damage, not a user error.
    fail(ErrorKind::kCorrupt, e.what());
  }
}

std::shared_ptr<const Model> model_from_hf_config(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object()) fail(ErrorKind::kInvalidInput, where + ": not a JSON object");
  const auto type = config.find("model_type");
  if (type == config.end() || !type->is_string()) {
    fail(ErrorKind::kInvalidInput, where + ": no \"model_type\" string (a Hugging Face config.json has one)");
  }
  std::string known;
  for (const Family* f : families()) {
    for (const std::string& t : f->hf_model_types) {
      if (t == type->get<std::string>()) return f->from_hf(config, where);
      known += (known.empty() ? "\"" : ", \"") + t + "\"";
    }
  }
  fail(ErrorKind::kInvalidInput,
       where + ": model_type " + value_excerpt(*type) + " is not one shardkit trains (" + known + ")");
}

}  // namespace shardkit::model
