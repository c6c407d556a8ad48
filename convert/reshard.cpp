#include "convert/reshard.hpp"

#include <vector>

#include "base/error.hpp"
#include "base/thread_pool.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/save.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/staging.hpp"

namespace shardkit::convert {
std::filesystem::path reshard(const ReshardRequest& request, const ConvertOptions& options) {
  const ckpt::CheckpointReader probe(request.source);
  const ckpt::Manifest& m = probe.manifest();
  const std::filesystem::path source_dir = probe.step_dir();
  ckpt::LayoutSpec spec = m.layout;
  spec.world_size = request.world_size;
  if (request.stage) spec.stage = *request.stage;
  const ckpt::Layout target(m.tensors, spec);  // validates world size and stage

  ckpt::CheckpointMeta meta;
  meta.step = m.step;
  meta.table = &m.tensors;
  meta.layout = spec;
  meta.states = m.states;
  meta.shard.chunk_elems = m.chunk_elems;
  meta.shard.compression_level = request.compression_level.value_or(m.compression_level);
  meta.trainer_state = m.trainer_state;
  meta.model = m.model;
  meta.config = m.config;
  // The trainer records the layout it ran with; the copy says what this checkpoint now holds.
  if (meta.trainer_state.contains("world_size")) meta.trainer_state["world_size"] = spec.world_size;
  if (meta.trainer_state.contains("zero_stage")) meta.trainer_state["zero_stage"] = spec.stage;

  StagedDirectory out(request.output, {request.source, source_dir}, options.force);
  const std::filesystem::path step_dir = out.path() / ckpt::step_dir_name(m.step);
  ckpt::prepare_step_dir(step_dir);
  const std::string uid = ckpt::make_checkpoint_uid();

  const StreamPlan plan = plan_stream(options, spec.world_size, m.chunk_elems);
  meta.shard.threads = 1;  // parallelism comes from writing several shards at once
  const int64_t total = m.tensors.total_elements() * static_cast<int64_t>(m.states.size() * sizeof(float));
  SharedProgress progress(options.progress, total);
  std::vector<ckpt::ShardRecord> records(static_cast<size_t>(spec.world_size));
  // Each worker has its own reader (readers cache chunks and are not shared between threads).
  std::vector<std::unique_ptr<ckpt::CheckpointReader>> readers(static_cast<size_t>(plan.threads));
  std::vector<std::vector<float>> pieces(static_cast<size_t>(plan.threads));
  ThreadPool pool(plan.threads - 1);
  pool.parallel_for(static_cast<size_t>(spec.world_size), [&](size_t rank, int worker) {
    auto& reader = readers[static_cast<size_t>(worker)];
    if (!reader) reader = std::make_unique<ckpt::CheckpointReader>(source_dir);
    auto& piece = pieces[static_cast<size_t>(worker)];
    piece.resize(static_cast<size_t>(plan.piece_elems));
    const int r = static_cast<int>(rank);
    const std::vector<ckpt::Fragment> fragments = target.fragments(r);
    ckpt::ShardWriter writer(step_dir / ckpt::shard_file_name(r, spec.world_size), m.tensors, target, {uid, m.step, r},
                             m.states, meta.shard);
    for (size_t s = 0; s < m.states.size(); ++s) {
      writer.begin_state(m.states[s]);
      const ReadFn read = [&](int tensor, int64_t offset, std::span<float> values) {
        reader->read(tensor, static_cast<int>(s), offset, values);
      };
      stream_flat(fragments, target.flat_size(), read, piece, writer, progress);
      writer.end_state();
    }
    records[rank] = writer.commit();
  });
  ckpt::commit_checkpoint(step_dir, ckpt::build_manifest(meta, uid, std::move(records)), true);
  out.commit();
  progress.finish();
  return request.output / ckpt::step_dir_name(m.step);
}

}  // namespace shardkit::convert
