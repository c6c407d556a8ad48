// Reads one shard written by ShardWriter. Opening validates the file against what the manifest
// expects (identity, layout, fragment table, chunk index, digest) and records where every chunk lies
// in the file (ckpt/shard_index.hpp: libhdf5 parses the metadata in an isolated process); data is then
// read with pread(2), chunk by chunk, each chunk checked against its XXH64 before any of it is
// returned.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/file_util.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/shard_index.hpp"
#include "ckpt/tensor_table.hpp"
#include "ckpt/zstd_codec.hpp"

namespace shardkit::ckpt {

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

  // Per-thread buffers of read_chunk: a compressed chunk as read, its decoder, and the last chunk
  // decoded whole (pieces that start or end inside a chunk are copied out of it, so consecutive small
  // reads of one chunk read it once).
  struct Scratch {
    std::vector<std::byte> raw;
    ZstdDecompressor decompressor;
    std::vector<float> decoded;
    const ShardReader* owner = nullptr;
    size_t state = 0;
    int64_t chunk = -1;
  };
  // Flat elements [flat_offset, flat_offset + length) of a state, all in one chunk, to copy to `out`.
  struct Piece {
    int64_t flat_offset = 0;
    int64_t length = 0;
    float* out = nullptr;
  };

  // Elements per chunk of this file's datasets.
  int64_t chunk_elems() const noexcept { return chunk_elems_; }
  // Reads, decodes and checks chunk `chunk` of `state` (an index into the expected states) once and
  // fills every piece; a piece that is the whole chunk receives it directly. Threads may call it at
  // once, each with its own scratch. Throws Error(kCorrupt) naming the file, state, chunk and tensors
  // when the checksum fails.
  void read_chunk(size_t state, int64_t chunk, std::span<const Piece> pieces, Scratch& scratch) const;

  // Reads and checks one chunk; returns an empty string when it is sound, else what is wrong.
  std::string check_chunk(size_t state, int64_t chunk, Scratch& scratch) const;
  // Bytes the chunk occupies in the file.
  int64_t chunk_storage_bytes(size_t state, int64_t chunk) const;

  // "tensor a[0:100], tensor b[5:9]" for the tensors held in flat elements [lo, hi).
  std::string describe_flat_range(int64_t lo, int64_t hi) const;

 private:
  void index_file(const ShardExpectation& expect);
  // Decodes chunk `chunk` of `state` into `out` (chunk_elems_ floats) and verifies its checksum.
  void load_chunk(size_t state, int64_t chunk, float* out, Scratch& scratch) const;
  // The chunk decoded and checked in `scratch` (read unless it is the one already there).
  const float* decoded_chunk(size_t state, int64_t chunk, Scratch& scratch) const;
  int64_t valid_elements(int64_t chunk) const noexcept;

  FileDescriptor fd_;
  std::string where_;
  const TensorTable* table_;
  std::vector<std::string> states_;
  std::vector<Fragment> fragments_;
  int64_t flat_size_ = 0;
  int64_t chunk_elems_ = 0;  // of this file's datasets: min(manifest chunk size, flat size)
  int64_t num_chunks_ = 0;
  std::vector<std::vector<ChunkLocation>> chunks_;  // [state][chunk]
  std::vector<std::vector<uint64_t>> checksums_;    // [state][chunk]
};

}  // namespace shardkit::ckpt
