// Reads a committed checkpoint at any world size and stage: any element range of any tensor and
// state, gathered from the shards that hold it, reading only the chunks it touches and verifying
// each one. This is the primitive of load-time resharding and of the converters.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/layout.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/shard_reader.hpp"

namespace shardkit::ckpt {

// Called with (bytes done, bytes in all) as long operations advance.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

struct VerifyReport {
  std::vector<std::string> problems;  // one line each, naming the file (and tensor where known)
  int shards_checked = 0;
  int64_t chunks_checked = 0;
  int64_t bytes_checked = 0;
  bool ok() const noexcept { return problems.empty(); }
};

// Elements [offset, offset + out.size()) of `tensor`'s `state` (an index into the manifest's states).
struct ReadRequest {
  int tensor = 0;
  int state = 0;
  int64_t offset = 0;
  std::span<float> out;
};

class CheckpointReader {
 public:
  // `path`: a step directory, or a run directory whose `latest` is followed. Parses and validates the
  // manifest; shards are opened (and validated) when first needed. With `read_threads` > 1, the
  // chunks of a read() are read, decoded and checked by that many threads.
  explicit CheckpointReader(const std::filesystem::path& path, int read_threads = 1);
  ~CheckpointReader();

  const std::filesystem::path& step_dir() const noexcept { return step_dir_; }
  const Manifest& manifest() const noexcept { return manifest_; }
  const TensorTable& tensors() const noexcept { return manifest_.tensors; }
  const Layout& layout() const noexcept { return layout_; }
  // Index of a state in the manifest, or -1.
  int find_state(std::string_view name) const;

  // Elements [offset, offset + out.size()) of `tensor`'s `state`.
  void read(int tensor, int state, int64_t offset, std::span<float> out);
  // Many ranges at once: every chunk they touch is read, decoded and checked once, in file order, on
  // the reader's threads. A resume passes all of a rank's ranges here, which keeps the disk busy.
  void read(std::span<const ReadRequest> requests);

  // Opens every shard and checks every chunk of every state against its checksum. Never throws for
  // a damaged checkpoint: the problems are in the report.
  VerifyReport verify(const ProgressFn& progress = {});

  // Opens `rank`'s shard afresh, with every check of a read (within the step directory, size,
  // identity, fragment table, digest), for a caller that refers to the file itself (the HDF5 view);
  // throws Error(kCorrupt) naming the file.
  std::unique_ptr<ShardReader> open_shard(int rank) const;

 private:
  ShardReader& shard(int rank);

  std::filesystem::path step_dir_;
  Manifest manifest_;
  Layout layout_;
  std::vector<std::unique_ptr<ShardReader>> shards_;
  std::unique_ptr<ThreadPool> pool_;  // read_threads > 1: reads the chunks of a read() in parallel
  std::vector<std::unique_ptr<ShardReader::Scratch>> scratch_;  // one per thread
};

}  // namespace shardkit::ckpt
