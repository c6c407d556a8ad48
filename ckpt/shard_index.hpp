// Where every chunk of a shard lies and what its checksums are, read from the shard's HDF5 metadata
// after checking the file against the documented schema and against what the manifest expects.
//
// The metadata comes from a file that may be damaged or crafted, and libhdf5 trusts it: a single
// changed byte can crash the library or send it into an endless loop. So the reading runs in an
// isolated child process (ckpt/isolated_process.hpp), with plugin loading off, and anything outside the
// schema (links other than hard links, external raw storage, virtual datasets, filters other than
// zstd on the state datasets, unexpected objects) is refused before any dataset is read. Only plain
// numbers come back; the caller then reads chunks with pread and checks each against its XXH64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/file_util.hpp"

namespace shardkit::ckpt {

// What the manifest says the shard's metadata must be.
struct ShardIndexRequest {
  std::string checkpoint_uid;
  std::string layout_fingerprint;  // hex
  int64_t step = 0;
  int64_t rank = 0;
  int64_t world_size = 0;
  int64_t stage = 0;
  int64_t alignment = 0;
  int64_t flat_size = 0;
  int64_t manifest_chunk_elems = 0;  // the checkpoint's chunk size, recorded as an attribute
  int64_t chunk_elems = 0;           // this file's: min(manifest's, flat size)
  int64_t num_chunks = 0;
  std::vector<int64_t> fragment_rows;  // (tensor, tensor offset, length, flat offset) per fragment
  std::vector<std::string> states;
};

struct ChunkLocation {
  int64_t address = 0;  // byte offset in the file
  int64_t size = 0;     // bytes stored
  bool compressed = false;
};

struct ShardIndex {
  std::vector<std::vector<ChunkLocation>> chunks;  // [state][chunk]
  std::vector<std::vector<uint64_t>> checksums;    // [state][chunk]
};

// Checks `file` against `request` and indexes its chunks, in an isolated process. Throws
// Error(kCorrupt) naming the file and the first check that fails, or the crash or time-out of the
// parse.
ShardIndex read_shard_index(const FileDescriptor& file, const ShardIndexRequest& request);

}  // namespace shardkit::ckpt
