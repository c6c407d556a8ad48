#include "convert/import_checkpoint.hpp"

#include <algorithm>
#include <vector>

#include "base/error.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/import.hpp"
#include "convert/source.hpp"
#include "convert/staging.hpp"

namespace shardkit::convert {

CheckpointImportResult import_checkpoint(const CheckpointImportRequest& request, const ConvertOptions& options) {
  const CheckpointSource source = request.format == SourceFormat::kDcp
                                      ? open_dcp_source(request.source, request.model)
                                      : open_deepspeed_source(request.source, request.model);
  // Weights alone (a DCP folder of the model's entries only) start a run, as `convert import` makes one:
  // step 0, zero moments.
  const bool weights_only = !source.has_moments;
  CheckpointImportResult result;
  result.world_size = request.world_size.value_or(source.world_size);
  result.stage = request.stage.value_or(source.stage);
  result.step = weights_only ? 0 : source.trainer_state["step"].get<int64_t>();
  const ckpt::TensorTable& table = *source.table;
  const ckpt::LayoutSpec spec{result.world_size, result.stage, ckpt::kDefaultAlignment};
  (void)ckpt::Layout(table, spec);  // refuses a bad world size or stage before anything is written

  ckpt::CheckpointMeta meta;
  meta.step = result.step;
  meta.table = &table;
  meta.layout = spec;
  // The source's states (AdamW's three, or Lion's two); weights alone start with AdamW's zero moments.
  meta.states = weights_only ? ckpt::adamw_state_names() : source.states;
  meta.shard.threads = 1;
  // The counters DeepSpeed keeps; the loss scaler and the data order come from the resuming run's own
  // config and seed, as for `convert import`.
  meta.trainer_state = weights_only ? fresh_trainer_state(source.path) : source.trainer_state;
  // What DeepSpeed needs back to resume: an export to DeepSpeed writes it again.
  if (source.run) meta.trainer_state["deepspeed"] = source.run->to_json();
  if (!source.config.is_null()) meta.config = source.config;
  meta.model = source.model;

  std::vector<std::filesystem::path> inputs = {request.source, source.path};
  std::error_code ec;
  if (std::filesystem::is_regular_file(request.model, ec)) inputs.emplace_back(request.model);
  StagedDirectory out(request.output, inputs, options.force);
  const StateReadFn source_read = source.reader();
  const StateReadFn read = [&](int state, int tensor, int64_t offset, std::span<float> values) {
    if (weights_only && state != kSourceFp32) {
      std::fill(values.begin(), values.end(), 0.0f);
    } else {
      source_read(state, tensor, offset, values);
    }
  };
  write_from_tensors(meta, out.path() / ckpt::step_dir_name(result.step), read, options);
  out.commit();
  result.step_dir = request.output / ckpt::step_dir_name(result.step);
  return result;
}

}  // namespace shardkit::convert
