#include "ckpt/checkpoint_reader.hpp"

#include <algorithm>
#include <tuple>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/thread_pool.hpp"
#include "ckpt/run_dir.hpp"

namespace shardkit::ckpt {

CheckpointReader::CheckpointReader(const std::filesystem::path& path, int read_threads)
    : step_dir_(resolve_checkpoint(path)),
      manifest_(read_manifest(step_dir_)),
      layout_(manifest_.tensors, manifest_.layout),
      shards_(static_cast<size_t>(manifest_.layout.world_size)),
      pool_(read_threads > 1 ? std::make_unique<ThreadPool>(read_threads - 1) : nullptr) {
  const int threads = pool_ ? pool_->concurrency() : 1;
  for (int i = 0; i < threads; ++i) scratch_.push_back(std::make_unique<ShardReader::Scratch>());
}

CheckpointReader::~CheckpointReader() = default;

int CheckpointReader::find_state(std::string_view name) const {
  for (size_t i = 0; i < manifest_.states.size(); ++i) {
    if (manifest_.states[i] == name) return static_cast<int>(i);
  }
  return -1;
}

std::unique_ptr<ShardReader> CheckpointReader::open_shard(int rank) const {
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
  // A shard that is a link out of the step directory would bring in a file from elsewhere.
  require_within_folder(step_dir_, step_dir_ / record.file, ErrorKind::kCorrupt);
  return std::make_unique<ShardReader>(step_dir_ / record.file, expect);
}

ShardReader& CheckpointReader::shard(int rank) {
  std::unique_ptr<ShardReader>& slot = shards_[static_cast<size_t>(rank)];
  if (!slot) slot = open_shard(rank);
  return *slot;
}

void CheckpointReader::read(int tensor, int state, int64_t offset, std::span<float> out) {
  const ReadRequest request{tensor, state, offset, out};
  read(std::span<const ReadRequest>(&request, 1));
}

void CheckpointReader::read(std::span<const ReadRequest> requests) {
  // Each request is cut where the layout places it (shard by shard) and at chunk boundaries; the
  // pieces are then grouped by the chunk they come from, so that each chunk is read once.
  struct Located {
    int rank;
    int state;
    int64_t chunk;
    ShardReader::Piece piece;
  };
  std::vector<Located> pieces;
  for (const ReadRequest& r : requests) {
    if (r.state < 0 || static_cast<size_t>(r.state) >= manifest_.states.size()) {
      fail(ErrorKind::kInternal, step_dir_.string() + ": state index " + std::to_string(r.state) + " out of range");
    }
    for (const Placement& p : layout_.locate(r.tensor, r.offset, static_cast<int64_t>(r.out.size()))) {
      const int64_t chunk_elems = shard(p.rank).chunk_elems();
      float* out = r.out.data() + (p.tensor_offset - r.offset);
      for (int64_t pos = p.flat_offset, end = p.flat_offset + p.length; pos < end;) {
        const int64_t chunk = pos / chunk_elems;
        const int64_t run = std::min(end, (chunk + 1) * chunk_elems) - pos;
        pieces.push_back({p.rank, r.state, chunk, {pos, run, out}});
        out += run;
        pos += run;
      }
    }
  }
  const auto chunk_of = [](const Located& l) { return std::tie(l.rank, l.state, l.chunk); };
  std::ranges::sort(pieces, [&](const Located& a, const Located& b) {
    return std::tuple_cat(chunk_of(a), std::tie(a.piece.flat_offset)) <
           std::tuple_cat(chunk_of(b), std::tie(b.piece.flat_offset));
  });
  std::vector<ShardReader::Piece> flat(pieces.size());
  std::ranges::transform(pieces, flat.begin(), &Located::piece);
  std::vector<size_t> starts;  // the first piece of each chunk
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i == 0 || chunk_of(pieces[i]) != chunk_of(pieces[i - 1])) starts.push_back(i);
  }
  starts.push_back(pieces.size());
  auto read_one = [&](size_t task, int worker) {
    const Located& first = pieces[starts[task]];
    const std::span<const ShardReader::Piece> of_chunk(flat.data() + starts[task], starts[task + 1] - starts[task]);
    shards_[static_cast<size_t>(first.rank)]->read_chunk(static_cast<size_t>(first.state), first.chunk, of_chunk,
                                                         *scratch_[static_cast<size_t>(worker)]);
  };
  const size_t tasks = starts.size() - 1;
  if (pool_ && tasks > 1) {
    pool_->parallel_for(tasks, read_one);
  } else {
    for (size_t t = 0; t < tasks; ++t) read_one(t, 0);
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
        std::string problem = reader->check_chunk(s, c, *scratch_[0]);
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
