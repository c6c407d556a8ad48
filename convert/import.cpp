#include "convert/import.hpp"

#include <vector>

#include "ckpt/error.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/thread_pool.hpp"
#include "convert/staging.hpp"
#include "model/hf_weights.hpp"

namespace shardkit::convert {

std::filesystem::path import_weights(const ImportRequest& request, const ConvertOptions& options) {
  const model::HfWeights weights(request.weights);
  const ckpt::TensorTable& table = weights.table();
  const ckpt::Layout layout(table, {request.world_size, request.stage, ckpt::kDefaultAlignment});

  ckpt::CheckpointMeta meta;
  meta.step = 0;
  meta.table = &table;
  meta.layout = layout.spec();
  meta.states = {std::string(ckpt::kMasterWeights), std::string(ckpt::kExpAvg), std::string(ckpt::kExpAvgSq)};
  meta.shard.threads = 1;
  // A fresh start: no optimizer step taken, the scheduler before its first step; the loss scaler and
  // the data order come from the training run's own config and seed.
  meta.trainer_state = {{"step", 0},
                        {"consumed_samples", 0},
                        {"skipped_steps", 0},
                        {"optimizer_steps", 0},
                        {"lr_scheduler", {{"last_batch_iteration", -1}}},
                        {"imported_from", request.weights.string()}};
  meta.model = weights.model()->to_json();

  // The weights, and for a single file the config.json beside it that HfWeights read.
  std::vector<std::filesystem::path> inputs = {request.weights};
  std::error_code ec;
  if (!std::filesystem::is_directory(request.weights, ec))
    inputs.push_back(request.weights.parent_path() / "config.json");
  StagedDirectory out(request.output, inputs, options.force);
  const std::filesystem::path step_dir = out.path() / ckpt::step_dir_name(0);
  ckpt::prepare_step_dir(step_dir);
  const std::string uid = ckpt::make_checkpoint_uid();
  const StreamPlan plan = plan_stream(options, request.world_size, ckpt::kDefaultChunkElems);
  SharedProgress progress(options.progress, table.total_elements() * 4);
  std::vector<ckpt::ShardRecord> records(static_cast<size_t>(request.world_size));
  std::vector<std::vector<float>> pieces(static_cast<size_t>(plan.threads));
  ckpt::ThreadPool pool(plan.threads - 1);
  pool.parallel_for(records.size(), [&](size_t rank, int worker) {
    std::vector<float>& piece = pieces[static_cast<size_t>(worker)];
    piece.resize(static_cast<size_t>(std::min(plan.piece_elems, std::max<int64_t>(1, layout.flat_size()))));
    const int r = static_cast<int>(rank);
    ckpt::ShardWriter writer(step_dir / ckpt::shard_file_name(r, request.world_size), table, layout, {uid, 0, r},
                             meta.states, meta.shard);
    // Master weights from the file, in the rank's flat order with zero padding; moments all zero.
    const std::vector<ckpt::Fragment> fragments = layout.fragments(r);
    const ReadFn from_file = [&](int tensor, int64_t offset, std::span<float> values) {
      weights.read(tensor, offset, values);
    };
    const ReadFn zero = [](int, int64_t, std::span<float> values) { std::fill(values.begin(), values.end(), 0.0f); };
    SharedProgress no_progress({}, 0);
    for (size_t s = 0; s < meta.states.size(); ++s) {
      writer.begin_state(meta.states[s]);
      stream_flat(fragments, layout.flat_size(), s == 0 ? from_file : zero, piece, writer,
                  s == 0 ? progress : no_progress);
      writer.end_state();
    }
    records[rank] = writer.commit();
  });
  ckpt::commit_checkpoint(step_dir, ckpt::build_manifest(meta, uid, std::move(records)), true);
  out.commit();
  progress.finish();
  return request.output / ckpt::step_dir_name(0);
}

}  // namespace shardkit::convert
