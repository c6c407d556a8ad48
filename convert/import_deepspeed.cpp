#include "convert/import_deepspeed.hpp"

#include <vector>

#include "base/error.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/deepspeed/ds_checkpoint.hpp"
#include "convert/staging.hpp"
#include "model/registry.hpp"

namespace shardkit::convert {

namespace {

// The config.json a Hugging Face Trainer run keeps beside its DeepSpeed checkpoint folder.
std::filesystem::path find_hf_config(const std::filesystem::path& source) {
  std::error_code ec;
  for (const std::filesystem::path& dir : {source, std::filesystem::absolute(source).parent_path()}) {
    if (std::filesystem::exists(dir / "config.json", ec)) return dir / "config.json";
  }
  fail(ErrorKind::kInvalidInput, source.string() +
                                     ": no config.json beside the checkpoint says which model it holds: give --model "
                                     "(a preset or a model file)");
}

}  // namespace

DeepSpeedImportResult import_deepspeed(const DeepSpeedImportRequest& request, const ConvertOptions& options) {
  const std::string model_name = request.model.empty() ? find_hf_config(request.source).string() : request.model;
  const std::shared_ptr<const model::Model> model = model::resolve_model(model_name);
  const deepspeed::DeepSpeedCheckpoint source(request.source, model);
  const bool universal = source.layout() == deepspeed::SourceLayout::kUniversal;
  DeepSpeedImportResult result;
  result.world_size = request.world_size.value_or(universal ? 1 : source.world_size());
  result.stage = request.stage.value_or(universal ? 0 : source.stage());
  result.step = source.trainer_state()["step"].get<int64_t>();
  const ckpt::TensorTable& table = model->table();
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
  meta.model = model->to_json();

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
