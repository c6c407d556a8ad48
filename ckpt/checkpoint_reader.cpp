#include "ckpt/checkpoint_reader.hpp"

#include "ckpt/error.hpp"
#include "ckpt/run_dir.hpp"
#include "ckpt/thread_pool.hpp"

namespace shardkit::ckpt {

CheckpointReader::CheckpointReader(const std::filesystem::path& path, int read_threads)
    : step_dir_(resolve_checkpoint(path)),
      manifest_(read_manifest(step_dir_)),
      layout_(manifest_.tensors, manifest_.layout),
      shards_(static_cast<size_t>(manifest_.layout.world_size)),
      pool_(read_threads > 1 ? std::make_unique<ThreadPool>(read_threads - 1) : nullptr) {}

CheckpointReader::~CheckpointReader() = default;

int CheckpointReader::find_state(std::string_view name) const {
  for (size_t i = 0; i < manifest_.states.size(); ++i) {
    if (manifest_.states[i] == name) return static_cast<int>(i);
  }
  return -1;
}

ShardReader& CheckpointReader::shard(int rank) {
  std::unique_ptr<ShardReader>& slot = shards_[static_cast<size_t>(rank)];
  if (!slot) {
    const ShardRecord& record = manifest_.shards[static_cast<size_t>(rank)];
    ShardExpectation expect;
    expect.table = &manifest_.tensors;
    expect.layout = &layout_;
    expect.rank = rank;
    expect.checkpoint_uid = manifest_.checkpoint_uid;
    expect.step = manifest_.step;
    expect.chunk_elems = manifest_.chunk_elems;
    expect.states = manifest_.states;
    expect.bytes = record.bytes;
    expect.digest = record.digest;
    slot = std::make_unique<ShardReader>(step_dir_ / record.file, expect);
  }
  return *slot;
}

void CheckpointReader::read(int tensor, int state, int64_t offset, std::span<float> out) {
  if (state < 0 || static_cast<size_t>(state) >= manifest_.states.size()) {
    fail(ErrorKind::kInternal, step_dir_.string() + ": state index " + std::to_string(state) + " out of range");
  }
  for (const Placement& p : layout_.locate(tensor, offset, static_cast<int64_t>(out.size()))) {
    shard(p.rank).read(static_cast<size_t>(state), p.flat_offset,
                       out.subspan(static_cast<size_t>(p.tensor_offset - offset), static_cast<size_t>(p.length)),
                       pool_.get());
  }
}

VerifyReport CheckpointReader::verify(const ProgressFn& progress) {
  VerifyReport report;
  const int64_t total = manifest_.total_bytes();
  int64_t done = 0;
  for (int rank = 0; rank < manifest_.layout.world_size; ++rank) {
    const ShardRecord& record = manifest_.shards[static_cast<size_t>(rank)];
    ShardReader* reader = nullptr;
    try {
      reader = &shard(rank);
    } catch (const Error& e) {
      report.problems.push_back(e.what());
      done += record.bytes;
      if (progress) progress(done, total);
      continue;
    }
    ++report.shards_checked;
    for (size_t s = 0; s < reader->num_states(); ++s) {
      for (int64_t c = 0; c < reader->num_chunks(); ++c) {
        std::string problem = reader->check_chunk(s, c);
        if (!problem.empty()) report.problems.push_back(std::move(problem));
        ++report.chunks_checked;
        const int64_t bytes = reader->chunk_storage_bytes(s, c);
        report.bytes_checked += bytes;
        done += bytes;
        if (progress) progress(std::min(done, total), total);
      }
    }
  }
  if (progress) progress(total, total);
  return report;
}

}  // namespace shardkit::ckpt
