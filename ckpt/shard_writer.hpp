// Writes one rank's shard: an HDF5 file holding the rank's flat buffers of fp32 master weights and
// Adam moments, the fragment table that says which tensor elements they hold, and an XXH64
// checksum per chunk. The file is written as "<name>.tmp" and appears under its final name only in
// commit(), after it is durable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/file_util.hpp"
#include "ckpt/layout.hpp"
#include "ckpt/tensor_table.hpp"

namespace shardkit {
class ThreadPool;
}  // namespace shardkit

namespace shardkit::ckpt {

class DirectWriter;
class ZstdCompressor;

struct ShardOptions {
  int64_t chunk_elems = 0;    // elements per HDF5 chunk; 0 = kDefaultChunkElems
  int compression_level = 0;  // 0 = store raw; 1..19 = zstd level (HDF5 filter 32015)
  int threads = 0;            // writer / compression threads; 0 = chosen from the hardware
  bool durable = true;        // fsync the file and its directory before commit() returns (and write raw
                              // chunks with direct I/O); false leaves the shard in the page cache
};

// What identifies the shard inside its checkpoint; written as attributes.
struct ShardIdentity {
  std::string checkpoint_uid;  // shared by all shards and the manifest of one checkpoint
  int64_t step = 0;
  int rank = 0;
};

// What commit() reports, and what the manifest lists for every shard.
struct ShardRecord {
  int rank = 0;
  std::string file;     // file name inside the step directory
  int64_t bytes = 0;    // file size
  uint64_t digest = 0;  // XXH64 over the chunk checksums of every state (docs/FORMAT.md)
};

class ShardWriter {
 public:
  // Creates `path`.tmp and writes the attributes and the fragment table of `identity.rank`.
  // `states` are the names of the flat buffers that write_state() will receive, in order.
  ShardWriter(const std::filesystem::path& path, const TensorTable& table, const Layout& layout,
              const ShardIdentity& identity, const std::vector<std::string>& states, const ShardOptions& options);
  // Removes the temporary file unless commit() succeeded.
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Writes the rank's flat buffer of one state: layout.flat_size() elements, padding included.
  void write_state(std::string_view state, std::span<const float> flat);

  // The same, streamed: begin_state, then append() pieces of any size in flat order until
  // layout.flat_size() elements were given, then end_state(). Memory stays at one chunk.
  void begin_state(std::string_view state);
  void append(std::span<const float> data);
  void end_state();

  // Requires every state written. Closes the file, fsyncs it (options.durable), renames it to its
  // final name and fsyncs the directory.
  ShardRecord commit();

 private:
  // Writes consecutive chunks of the open state (only the dataset's last chunk may be short).
  void write_chunks(const std::vector<std::span<const float>>& chunks);
  int64_t chunk_elems() const noexcept;

  std::filesystem::path path_;
  std::filesystem::path tmp_path_;
  std::string where_;
  int64_t flat_size_;
  int64_t chunk_elems_;
  ShardOptions options_;
  int rank_;
  std::vector<std::string> states_;
  std::vector<std::vector<uint64_t>> checksums_;  // per state, per chunk; empty until written
  std::vector<bool> written_;
  // The state being written (its dataset is Handles::dataset): how much arrived, the next chunk, a
  // partial chunk, and (uncompressed) every chunk's address in the file.
  struct OpenState {
    size_t index = 0;
    int64_t received = 0;
    int64_t next_chunk = 0;
    std::vector<float> pending;
    std::vector<int64_t> addresses;
  };
  std::unique_ptr<OpenState> open_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<std::unique_ptr<ZstdCompressor>> compressors_;  // per pool worker
  std::vector<std::vector<std::byte>> padded_;                // per pool worker
  std::vector<std::vector<std::byte>> frames_;                // per chunk of a batch
  struct Handles;  // the file's HDF5 objects (shard_writer.cpp: HDF5 stays inside ckpt's HDF5 module)
  std::unique_ptr<Handles> h5_;
  std::unique_ptr<DirectWriter> raw_;  // uncompressed shards: the chunks' writer
  // Another descriptor of the file being written, to start write-back as chunks accumulate.
  FileDescriptor writeback_fd_;
  int64_t unflushed_bytes_ = 0;
  bool committed_ = false;
};

// Whether several threads may write (or read) shards at once: the HDF5 library was built thread-safe.
bool shards_parallel_safe();

// The digest that ties a shard's chunk checksums to the manifest.
uint64_t shard_digest(const std::vector<std::string>& states, const std::vector<std::vector<uint64_t>>& checksums);

}  // namespace shardkit::ckpt
