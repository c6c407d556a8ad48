// The model families shardkit knows, and the ways a model is named: a preset, a JSON model file (the
// family's own fields, or a Hugging Face config.json), a manifest's "model" object.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.hpp"

namespace shardkit::model {

// What a family registers (model/<family>/model.hpp returns one).
struct Family {
  std::string name;                         // as manifests record it
  std::vector<std::string> hf_model_types;  // config.json "model_type" values it reads
  std::vector<std::string> presets;
  // The preset called `name`; only called with one of `presets`.
  std::function<std::shared_ptr<const Model>(const std::string& name)> preset;
  // The family's own JSON form (Model::to_json(), or a model file written by hand).
  std::function<std::shared_ptr<const Model>(const nlohmann::json& j, const std::string& where)> from_json;
  // A Hugging Face config.json of one of hf_model_types.
  std::function<std::shared_ptr<const Model>(const nlohmann::json& j, const std::string& where)> from_hf;
};

// A family's descriptor from its configuration type's functions; `presets` must outlive it.
template <typename Config>
Family describe_family(std::string name, std::vector<std::string> hf_model_types, const std::vector<Config>& presets,
                       std::shared_ptr<const Model> (*make)(const Config&),
                       Config (*from_json)(const nlohmann::json&, const std::string&),
                       Config (*from_hf)(const nlohmann::json&, const std::string&)) {
  Family f{std::move(name), std::move(hf_model_types), {}, {}, {}, {}};
  for (const Config& c : presets) f.presets.push_back(c.name);
  f.preset = [&presets, make](const std::string& wanted) {
    for (const Config& c : presets) {
      if (c.name == wanted) return make(c);
    }
    return std::shared_ptr<const Model>();
  };
  f.from_json = [make, from_json](const nlohmann::json& j, const std::string& where) {
    return make(from_json(j, where));
  };
  f.from_hf = [make, from_hf](const nlohmann::json& j, const std::string& where) { return make(from_hf(j, where)); };
  return f;
}

const std::vector<const Family*>& families();

// A preset of any family, or a JSON file: with "family" the family's own form, with "model_type" a
// Hugging Face config.json, otherwise GPT-2's original form (n_layer, n_head, ...).
// Error(kInvalidInput) naming the presets or the file and field.
std::shared_ptr<const Model> resolve_model(const std::string& model);

// The manifest "family" of a checkpoint that holds the tensors of a model shardkit has no family for
// (a DeepSpeed checkpoint imported without a model): its tensors carry the module's own names, and it
// can be resharded, consolidated and exported, not trained or evaluated. Its "model" object may carry
// the Hugging Face config.json found beside the source ("hf_config"), which exports write back.
inline constexpr const char* kExternalFamily = "external";
bool is_external(const nlohmann::json& manifest_model);

// A manifest's "model" object; one without "family" was written before families existed and is
// GPT-2's. Error(kCorrupt) naming `where` when it describes no valid model; Error(kInvalidInput) when
// it is an external model, which no family computes.
std::shared_ptr<const Model> model_from_manifest(const nlohmann::json& model, const std::string& where);

// A Hugging Face config.json, by its model_type. Error(kInvalidInput) naming `where`.
std::shared_ptr<const Model> model_from_hf_config(const nlohmann::json& config, const std::string& where);

// Every preset name, comma-separated, for help texts and messages.
std::string preset_list();

}  // namespace shardkit::model
