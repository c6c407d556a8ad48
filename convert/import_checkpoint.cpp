#include "convert/import_checkpoint.hpp"

#include <vector>

#include "base/error.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/source.hpp"
#include "convert/staging.hpp"

namespace shardkit::convert {

CheckpointImportResult import_checkpoint(const CheckpointImportRequest& request, const ConvertOptions& options) {
  const CheckpointSource source = request.format == SourceFormat::kDcp
                                      ? open_dcp_source(request.source, request.model)
                                      : open_deepspeed_source(request.source, request.model);
  if (!source.has_moments) {
    fail(ErrorKind::kInvalidInput, source.path.string() +
                                       ": the checkpoint holds weights without optimizer state; a checkpoint to "
                                       "train from needs AdamW's moments (`convert consolidate` exports the weights)");
  }
  CheckpointImportResult result;
  result.world_size = request.world_size.value_or(source.world_size);
  result.stage = request.stage.value_or(source.stage);
  result.step = source.trainer_state["step"].get<int64_t>();
  const ckpt::TensorTable& table = *source.table;
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
  meta.trainer_state = source.trainer_state;
  // What DeepSpeed needs back to resume: an export to DeepSpeed writes it again.
  if (source.run) meta.trainer_state["deepspeed"] = source.run->to_json();
  if (!source.config.is_null()) meta.config = source.config;
  meta.model = source.model;

  std::vector<std::filesystem::path> inputs = {request.source, source.path};
  std::error_code ec;
  if (std::filesystem::is_regular_file(request.model, ec)) inputs.emplace_back(request.model);
  StagedDirectory out(request.output, inputs, options.force);
  const StateReadFn read = source.reader();
  write_from_tensors(meta, out.path() / ckpt::step_dir_name(result.step), read, options);
  out.commit();
  result.step_dir = request.output / ckpt::step_dir_name(result.step);
  return result;
}

}  // namespace shardkit::convert
