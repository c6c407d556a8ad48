#include "convert/import.hpp"

#include <vector>

#include "base/error.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/staging.hpp"
#include "model/hf_weights.hpp"

namespace shardkit::convert {

nlohmann::json fresh_trainer_state(const std::filesystem::path& imported_from) {
  return {{"step", 0},
          {"consumed_samples", 0},
          {"skipped_steps", 0},
          {"optimizer_steps", 0},
          {"lr_scheduler", {{"last_batch_iteration", -1}}},
          {"imported_from", imported_from.string()}};
}

std::filesystem::path import_weights(const ImportRequest& request, const ConvertOptions& options) {
  const model::HfWeights weights(request.weights);
  const ckpt::TensorTable& table = weights.table();
  const ckpt::LayoutSpec spec{request.world_size, request.stage, ckpt::kDefaultAlignment};
  (void)ckpt::Layout(table, spec);  // refuses a bad world size or stage before anything is written

  ckpt::CheckpointMeta meta;
  meta.step = 0;
  meta.table = &table;
  meta.layout = spec;
  meta.states = ckpt::adamw_state_names();
  meta.shard.threads = 1;
  meta.trainer_state = fresh_trainer_state(request.weights);
  meta.model = weights.model()->to_json();

  // The weights, and for a single file the config.json beside it that HfWeights read.
  std::vector<std::filesystem::path> inputs = {request.weights};
  std::error_code ec;
  if (!std::filesystem::is_directory(request.weights, ec))
    inputs.push_back(request.weights.parent_path() / "config.json");
  StagedDirectory out(request.output, inputs, options.force);
  // Master weights from the file; moments all zero.
  write_from_tensors(
      meta, out.path() / ckpt::step_dir_name(0),
      [&](int state, int tensor, int64_t offset, std::span<float> values) {
        if (state == 0) {
          weights.read(tensor, offset, values);
        } else {
          std::fill(values.begin(), values.end(), 0.0f);
        }
      },
      options);
  out.commit();
  return request.output / ckpt::step_dir_name(0);
}

}  // namespace shardkit::convert
