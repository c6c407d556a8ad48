#include "convert/import_deepspeed.hpp"

#include <vector>

#include "ckpt/error.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/deepspeed/ds_checkpoint.hpp"
#include "convert/staging.hpp"
#include "model/registry.hpp"

namespace shardkit::convert {

DeepSpeedImportResult import_deepspeed(const DeepSpeedImportRequest& request, const ConvertOptions& options) {
  const std::shared_ptr<const model::Model> model = model::resolve_model(request.model);
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
  meta.states = {std::string(ckpt::kMasterWeights), std::string(ckpt::kExpAvg), std::string(ckpt::kExpAvgSq)};
  meta.shard.threads = 1;
  // The counters DeepSpeed keeps; the loss scaler and the data order come from the resuming run's own
  // config and seed, as for `convert import`.
  meta.trainer_state = source.trainer_state();
  meta.model = model->to_json();

  StagedDirectory out(request.output, {request.source}, options.force);
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
