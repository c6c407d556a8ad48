#include "convert/import_deepspeed.hpp"

#include <vector>

#include "base/error.hpp"
#include "base/json_input.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/deepspeed/ds_checkpoint.hpp"
#include "convert/staging.hpp"
#include "model/registry.hpp"

namespace shardkit::convert {

namespace {

// The config.json a Hugging Face Trainer run keeps beside its DeepSpeed checkpoint folder: in the folder
// given, or in the one above a tag folder. Empty when there is none.
std::filesystem::path find_hf_config(const std::filesystem::path& source) {
  std::error_code ec;
  for (const std::filesystem::path& dir : {source, std::filesystem::absolute(source).parent_path()}) {
    if (std::filesystem::is_regular_file(dir / "config.json", ec)) return dir / "config.json";
  }
  return {};
}

bool known_model_type(const nlohmann::json& config) {
  const auto type = config.find("model_type");
  if (type == config.end() || !type->is_string()) return false;
  for (const model::Family* f : model::families()) {
    for (const std::string& t : f->hf_model_types) {
      if (t == type->get<std::string>()) return true;
    }
  }
  return false;
}

}  // namespace

DeepSpeedImportResult import_deepspeed(const DeepSpeedImportRequest& request, const ConvertOptions& options) {
  // The model: --model; else the Trainer's config.json when a family computes it; else none, and the
  // tensors are whatever the checkpoint names (consolidate and reshard need no more).
  std::string model_name = request.model;
  nlohmann::json hf_config;
  if (model_name.empty()) {
    if (const std::filesystem::path config = find_hf_config(request.source); !config.empty()) {
      hf_config = read_json_file(config, json_limits::kConfig, ErrorKind::kInvalidInput);
      if (known_model_type(hf_config)) model_name = config.string();
    }
  }
  const std::shared_ptr<const model::Model> model = model_name.empty() ? nullptr : model::resolve_model(model_name);
  const deepspeed::DeepSpeedCheckpoint source(request.source, model);
  const bool universal = source.layout() == deepspeed::SourceLayout::kUniversal;
  DeepSpeedImportResult result;
  result.world_size = request.world_size.value_or(universal ? 1 : source.world_size());
  result.stage = request.stage.value_or(universal ? 0 : source.stage());
  result.step = source.trainer_state()["step"].get<int64_t>();
  const ckpt::TensorTable& table = source.table();
  const ckpt::LayoutSpec spec{result.world_size, result.stage, ckpt::kDefaultAlignment};
  (void)ckpt::Layout(table, spec);  // refuses a bad world size or stage before anything is written

  ckpt::CheckpointMeta meta;
  meta.step = result.step;
  meta.table = &table;
  meta.layout = spec;
  meta.states = ckpt::optimizer_state_names();
  meta.shard.threads = 1;
  // The counters DeepSpeed keeps; the loss scaler and the data order come from the resuming run's own
  // config and seed, as for `convert import`.
  meta.trainer_state = source.trainer_state();
  // What DeepSpeed needs back to resume: an export to DeepSpeed writes it again.
  if (source.run()) meta.trainer_state["deepspeed"] = source.run()->to_json();
  if (!source.ds_config().is_null()) meta.config = source.ds_config();
  if (model) {
    meta.model = model->to_json();
  } else {
    meta.model = {{"family", model::kExternalFamily}, {"name", source.folder().filename().string()}};
    if (hf_config.is_object()) meta.model["hf_config"] = hf_config;
  }

  std::vector<std::filesystem::path> inputs = {request.source};
  std::error_code ec;
  if (std::filesystem::is_regular_file(model_name, ec)) inputs.emplace_back(model_name);
  StagedDirectory out(request.output, inputs, options.force);
  write_from_tensors(
      meta, out.path() / ckpt::step_dir_name(result.step),
      [&](int state, int tensor, int64_t offset, std::span<float> values) {
        source.read(state, tensor, offset, values);
      },
      options);
  out.commit();
  result.step_dir = request.output / ckpt::step_dir_name(result.step);
  return result;
}

}  // namespace shardkit::convert
