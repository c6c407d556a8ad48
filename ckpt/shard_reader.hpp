// Reads one shard written by ShardWriter. Opening validates the file against what the manifest
// expects (identity, layout, fragment table, chunk index, digest) and records where every chunk lies
// in the file; the HDF5 handles are then closed and data is read with pread(2), chunk by chunk, each
// chunk checked against its XXH64 before any of it is returned.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/file_util.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/tensor_table.hpp"
#include "ckpt/zstd_codec.hpp"

namespace shardkit::ckpt {

class ThreadPool;

// What the manifest says a shard must be.
struct ShardExpectation {
  const TensorTable* table = nullptr;
  const Layout* layout = nullptr;
  int rank = 0;
  std::string checkpoint_uid;
  int64_t step = 0;
  int64_t chunk_elems = 0;
  std::vector<std::string> states;
  int64_t bytes = 0;    // file size
  uint64_t digest = 0;  // shard_digest() of its checksums
};

class ShardReader {
 public:
  // Throws Error(kCorrupt) naming the file and the first check that fails.
  ShardReader(const std::filesystem::path& path, const ShardExpectation& expect);

  const std::filesystem::path& path() const noexcept { return fd_.path(); }
  const std::vector<Fragment>& fragments() const noexcept { return fragments_; }
  int64_t num_chunks() const noexcept { return num_chunks_; }
  size_t num_states() const noexcept { return states_.size(); }
  const std::string& state_name(size_t state) const { return states_[state]; }

  // Reads flat elements [offset, offset + out.size()) of a state (index into the expected states).
  // Whole chunks of the range are read, decoded and checked by `pool`'s threads when one is given.
  // Throws Error(kCorrupt) naming the file, state, chunk and tensors when a checksum fails.
  void read(size_t state, int64_t offset, std::span<float> out, ThreadPool* pool = nullptr);

  // Reads and checks one chunk; returns an empty string when it is sound, else what is wrong.
  std::string check_chunk(size_t state, int64_t chunk);
  // Bytes the chunk occupies in the file.
  int64_t chunk_storage_bytes(size_t state, int64_t chunk) const;

  // "tensor a[0:100], tensor b[5:9]" for the tensors held in flat elements [lo, hi).
  std::string describe_flat_range(int64_t lo, int64_t hi) const;

 private:
  struct ChunkLocation {
    int64_t address = 0;
    int64_t size = 0;
    bool compressed = false;
  };

  // What decoding a compressed chunk needs; one per thread.
  struct Scratch {
    std::vector<std::byte> raw;  // a compressed chunk as read
    ZstdDecompressor decompressor;
  };

  void index_file(const ShardExpectation& expect);
  // Decodes chunk `chunk` of `state` into `out` (chunk_elems_ floats) and verifies its checksum.
  void load_chunk(size_t state, int64_t chunk, float* out, Scratch& scratch);
  int64_t valid_elements(int64_t chunk) const noexcept;

  FileDescriptor fd_;
  std::string where_;
  const TensorTable* table_;
  std::vector<std::string> states_;
  std::vector<Fragment> fragments_;
  int64_t flat_size_ = 0;
  int64_t chunk_elems_ = 0;  // of this file's datasets: min(manifest chunk size, flat size)
  int64_t num_chunks_ = 0;
  std::vector<std::vector<ChunkLocation>> chunks_;      // [state][chunk]
  std::vector<std::vector<uint64_t>> checksums_;        // [state][chunk]
  Scratch scratch_;                                     // the calling thread's
  std::vector<std::unique_ptr<Scratch>> pool_scratch_;  // one per pool worker
  // The last decoded chunk (one for all states, so that memory per open shard stays one chunk):
  // ranges that start or end inside a chunk read it from here.
  size_t cached_state_ = 0;
  int64_t cached_chunk_ = -1;
  std::vector<float> cache_;
};

}  // namespace shardkit::ckpt
