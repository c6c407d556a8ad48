#include "convert/stream.hpp"

#include <algorithm>
#include <thread>

#include "base/error.hpp"
#include "base/thread_pool.hpp"
#include "ckpt/shard_format.hpp"

namespace shardkit::convert {

StreamPlan plan_stream(const ConvertOptions& options, int max_useful_threads, int64_t chunk_elems) {
  // Per thread, besides its pieces: a chunk decoded and a chunk as stored in the shard reader, the
  // same two in the shard writer, and HDF5's and zstd's own state.
  constexpr int64_t kLibraryPerThread = int64_t{16} << 20;
  constexpr int64_t kMinPiece = int64_t{1} << 16;  // elements
  const int64_t per_thread_fixed = kLibraryPerThread + 4 * chunk_elems * static_cast<int64_t>(sizeof(float));
  const int64_t min_per_thread = per_thread_fixed + 2 * kMinPiece * static_cast<int64_t>(sizeof(float));
  if (options.max_memory < (int64_t{128} << 20)) {
    fail(ErrorKind::kInvalidInput, "--max-memory must be at least 128MiB");
  }
  StreamPlan plan;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  plan.threads = options.threads > 0 ? options.threads : std::min(hw, 8);
  plan.threads = std::max(1, std::min(plan.threads, max_useful_threads));
  // HDF5 must be built thread-safe for several threads to write shards at once.
  if (!ckpt::shards_parallel_safe()) plan.threads = 1;
  // Fewer threads with larger pieces rather than many threads with pieces too small to be efficient.
  while (plan.threads > 1 && options.max_memory / plan.threads < 2 * min_per_thread) --plan.threads;
  const int64_t per_thread = options.max_memory / plan.threads - per_thread_fixed;
  // Pieces of at most 16 MiB: large enough for efficient I/O, small enough that the threads overlap
  // reading and writing instead of taking a whole tensor each.
  constexpr int64_t kMaxPiece = int64_t{1} << 22;
  plan.piece_elems = std::min(per_thread / 2 / static_cast<int64_t>(sizeof(float)), kMaxPiece);
  if (options.piece_elems > 0) plan.piece_elems = std::min(plan.piece_elems, options.piece_elems);
  return plan;
}

void SharedProgress::add(int64_t bytes) {
  const int64_t done = done_.fetch_add(bytes) + bytes;
  if (!fn_) return;
  std::unique_lock lock(mutex_, std::try_to_lock);  // a busy reporter skips, it does not wait
  if (lock.owns_lock()) fn_(std::min(done, total_), total_);
}

void SharedProgress::finish() {
  if (!fn_) return;
  std::lock_guard lock(mutex_);
  fn_(total_, total_);
}

void stream_flat(const std::vector<ckpt::Fragment>& fragments, int64_t flat_size, const ReadFn& read,
                 std::vector<float>& piece, ckpt::ShardWriter& writer, SharedProgress& progress) {
  const int64_t capacity = static_cast<int64_t>(piece.size());
  auto zeros = [&](int64_t count) {
    while (count > 0) {
      const int64_t n = std::min(count, capacity);
      std::fill(piece.begin(), piece.begin() + n, 0.0f);
      writer.append(std::span<const float>(piece.data(), static_cast<size_t>(n)));
      count -= n;
    }
  };
  int64_t position = 0;
  for (const ckpt::Fragment& f : fragments) {
    zeros(f.flat_offset - position);
    for (int64_t done = 0; done < f.length; done += capacity) {
      const std::span<float> part(piece.data(), static_cast<size_t>(std::min(capacity, f.length - done)));
      read(f.tensor, f.tensor_offset + done, part);
      writer.append(part);
      progress.add(static_cast<int64_t>(part.size() * sizeof(float)));
    }
    position = f.flat_offset + f.length;
  }
  zeros(flat_size - position);
}

void write_from_tensors(const ckpt::CheckpointMeta& meta, const std::filesystem::path& step_dir,
                        const StateReadFn& read, const ConvertOptions& options) {
  const ckpt::TensorTable& table = *meta.table;
  const ckpt::Layout layout(table, meta.layout);
  const int world = meta.layout.world_size;
  ckpt::prepare_step_dir(step_dir);
  const std::string uid = ckpt::make_checkpoint_uid();
  const StreamPlan plan = plan_stream(options, world, ckpt::kDefaultChunkElems);
  SharedProgress progress(options.progress, table.total_elements() * 4 * static_cast<int64_t>(meta.states.size()));
  std::vector<ckpt::ShardRecord> records(static_cast<size_t>(world));
  std::vector<std::vector<float>> pieces(static_cast<size_t>(plan.threads));
  ThreadPool pool(plan.threads - 1);
  pool.parallel_for(records.size(), [&](size_t rank, int worker) {
    std::vector<float>& piece = pieces[static_cast<size_t>(worker)];
    piece.resize(static_cast<size_t>(std::min(plan.piece_elems, std::max<int64_t>(1, layout.flat_size()))));
    const int r = static_cast<int>(rank);
    ckpt::ShardWriter writer(step_dir / ckpt::shard_file_name(r, world), table, layout, {uid, meta.step, r},
                             meta.states, meta.shard);
    const std::vector<ckpt::Fragment> fragments = layout.fragments(r);
    for (size_t s = 0; s < meta.states.size(); ++s) {
      writer.begin_state(meta.states[s]);
      const ReadFn read_state = [&](int tensor, int64_t offset, std::span<float> values) {
        read(static_cast<int>(s), tensor, offset, values);
      };
      stream_flat(fragments, layout.flat_size(), read_state, piece, writer, progress);
      writer.end_state();
    }
    records[rank] = writer.commit();
  });
  ckpt::commit_checkpoint(step_dir, ckpt::build_manifest(meta, uid, std::move(records)), true);
  progress.finish();
}

}  // namespace shardkit::convert
