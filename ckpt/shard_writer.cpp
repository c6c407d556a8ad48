#include "ckpt/shard_writer.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/thread_pool.hpp"
#include "base/write_target.hpp"
#include "base/xxh64.hpp"
#include "ckpt/direct_writer.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/zstd_codec.hpp"

namespace shardkit::ckpt {

// Declared in this order so that they close in reverse: the open state's dataset, the groups, then
// the file.
struct ShardWriter::Handles {
  h5::Id file;
  h5::Id state_group;
  h5::Id checksum_group;
  h5::Id dataset;  // the state being written
};

bool shards_parallel_safe() {
  hbool_t threadsafe = 0;
  return H5is_library_threadsafe(&threadsafe) >= 0 && threadsafe;
}

uint64_t shard_digest(const std::vector<std::string>& states, const std::vector<std::vector<uint64_t>>& checksums) {
  Xxh64 h;
  for (size_t s = 0; s < states.size(); ++s) {
    h.update(states[s].data(), states[s].size());
    const uint64_t count = checksums[s].size();
    h.update(&count, sizeof(count));
    h.update(checksums[s].data(), checksums[s].size() * sizeof(uint64_t));
  }
  return h.digest();
}

ShardWriter::ShardWriter(const std::filesystem::path& path, const TensorTable& table, const Layout& layout,
                         const ShardIdentity& identity, const std::vector<std::string>& states,
                         const ShardOptions& options)
    : path_(path),
      tmp_path_(std::filesystem::path(path) += ".tmp"),
      where_(path.string()),
      flat_size_(layout.flat_size()),
      chunk_elems_(options.chunk_elems > 0 ? options.chunk_elems : kDefaultChunkElems),
      options_(options),
      rank_(identity.rank),
      states_(states),
      checksums_(states.size()),
      written_(states.size(), false),
      h5_(std::make_unique<Handles>()) {
  if (chunk_elems_ > kMaxChunkElems) {
    fail(ErrorKind::kInvalidInput, "chunk size of " + std::to_string(chunk_elems_) + " elements exceeds the maximum " +
                                       std::to_string(kMaxChunkElems));
  }
  if (options.compression_level != 0 && !is_valid_zstd_level(options.compression_level)) {
    fail(ErrorKind::kInvalidInput,
         "zstd level " + std::to_string(options.compression_level) + " is out of range (0 = off, 1..19)");
  }
  if (states.empty() || states.size() > kMaxStates) fail(ErrorKind::kInvalidInput, "a shard needs 1-16 states");
  for (size_t i = 0; i < states.size(); ++i) {
    if (!is_plain_name(states[i]) || std::find(states.begin(), states.begin() + static_cast<long>(i), states[i]) !=
                                         states.begin() + static_cast<long>(i)) {
      fail(ErrorKind::kInvalidInput, "state name '" + states[i] + "' is not a plain, unique name");
    }
  }
  if (layout.num_tensors() != table.size()) fail(ErrorKind::kInternal, "layout and tensor table disagree");
  pool_ = std::make_unique<ThreadPool>(ThreadPool::default_threads(options.threads));

  // Uncompressed chunks start on 4 KiB boundaries, so that they can be written with direct I/O.
  const bool raw = options.compression_level == 0;
  // libhdf5 would follow a symbolic link left at the temporary name and truncate its target: the file
  // is created here first, as a new regular file, and libhdf5 then truncates that one.
  create_fresh_file(tmp_path_).close();
  h5_->file = h5::create_file(tmp_path_, raw ? static_cast<int64_t>(DirectWriter::kAlignment) : 0);
  if (raw) {
    raw_ = std::make_unique<DirectWriter>(tmp_path_, pool_->concurrency(),
                                          static_cast<size_t>(chunk_elems()) * sizeof(float), options.durable);
  }
  if (options_.durable) writeback_fd_ = FileDescriptor(tmp_path_, O_RDONLY);
  const hid_t root = h5_->file.get();
  const LayoutSpec& spec = layout.spec();
  h5::write_attribute(root, shard_attr::kFormat, std::string(kShardFormatName), where_);
  h5::write_attribute(root, shard_attr::kFormatVersion, int64_t{kFormatVersion}, where_);
  h5::write_attribute(root, shard_attr::kCheckpointUid, identity.checkpoint_uid, where_);
  h5::write_attribute(root, shard_attr::kStep, identity.step, where_);
  h5::write_attribute(root, shard_attr::kRank, int64_t{identity.rank}, where_);
  h5::write_attribute(root, shard_attr::kWorldSize, int64_t{spec.world_size}, where_);
  h5::write_attribute(root, shard_attr::kStage, int64_t{spec.stage}, where_);
  h5::write_attribute(root, shard_attr::kAlignment, spec.alignment, where_);
  h5::write_attribute(root, shard_attr::kFlatSize, flat_size_, where_);
  h5::write_attribute(root, shard_attr::kChunkElems, chunk_elems_, where_);
  h5::write_attribute(root, shard_attr::kLayoutFingerprint, to_hex(layout_fingerprint(table, spec)), where_);
  std::string state_list;
  for (const std::string& s : states) state_list += (state_list.empty() ? "" : ",") + s;
  h5::write_attribute(root, shard_attr::kStates, state_list, where_);

  // Fragment table: one row (tensor, tensor_offset, length, flat_offset) per fragment.
  const std::vector<Fragment> fragments = layout.fragments(identity.rank);
  std::vector<int64_t> rows;
  rows.reserve(fragments.size() * 4);
  for (const Fragment& f : fragments) rows.insert(rows.end(), {f.tensor, f.tensor_offset, f.length, f.flat_offset});
  h5::write_int64_dataset(root, shard_path::kFragments, {fragments.size(), 4}, rows.data(), where_);
  std::vector<std::string> names;
  names.reserve(table.size());
  for (const TensorInfo& t : table) names.push_back(t.name);
  h5::write_string_dataset(root, shard_path::kTensorNames, names, where_);

  h5_->state_group = h5::create_group(root, shard_path::kStateGroup, where_);
  h5_->checksum_group = h5::create_group(root, shard_path::kChecksumGroup, where_);
}

ShardWriter::~ShardWriter() {
  if (committed_) return;
  open_.reset();
  h5_.reset();  // closes the dataset, the groups, then the file
  std::error_code ec;
  std::filesystem::remove(tmp_path_, ec);
}

int64_t ShardWriter::chunk_elems() const noexcept {
  return std::min(chunk_elems_, flat_size_);
}

void ShardWriter::write_state(std::string_view state, std::span<const float> flat) {
  if (static_cast<int64_t>(flat.size()) != flat_size_) {
    fail(ErrorKind::kInternal, where_ + ": state " + std::string(state) + " has " + std::to_string(flat.size()) +
                                   " elements, the layout gives this rank " + std::to_string(flat_size_));
  }
  begin_state(state);
  append(flat);
  end_state();
}

void ShardWriter::begin_state(std::string_view state) {
  const auto it = std::find(states_.begin(), states_.end(), state);
  if (it == states_.end()) fail(ErrorKind::kInternal, where_ + ": state " + std::string(state) + " was not declared");
  const size_t index = static_cast<size_t>(it - states_.begin());
  if (written_[index] || open_) {
    fail(ErrorKind::kInternal, where_ + ": state " + std::string(state) + " written twice or while another is open");
  }
  const std::string name(state);
  const std::string context = where_ + ": state " + name;
  const hsize_t dims[1] = {static_cast<hsize_t>(flat_size_)};
  h5::Id space = h5::check_id(H5Screate_simple(1, dims, nullptr), "H5Screate_simple");
  h5::Id dcpl = h5::check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
  const int64_t chunk = chunk_elems();
  if (chunk > 0) {
    const hsize_t chunk_dims[1] = {static_cast<hsize_t>(chunk)};
    h5::check(H5Pset_chunk(dcpl.get(), 1, chunk_dims), context + ": H5Pset_chunk");
    // Chunks are written whole; no fill values are ever needed.
    h5::check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), context + ": H5Pset_fill_time");
    // Uncompressed chunks get their space (and so their addresses) now: they are then written
    // straight to the file by several threads.
    if (raw_) h5::check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), context + ": H5Pset_alloc_time");
    if (options_.compression_level > 0) {
      const unsigned level = static_cast<unsigned>(options_.compression_level);
      h5::check(H5Pset_filter(dcpl.get(), kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level),
                context + ": H5Pset_filter(zstd)");
    }
  }
  open_ = std::make_unique<OpenState>();
  open_->index = index;
  h5_->dataset = h5::check_id(H5Dcreate2(h5_->state_group.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                         dcpl.get(), H5P_DEFAULT),
                              context + ": cannot create dataset");
  const int64_t num_chunks = chunk > 0 ? (flat_size_ + chunk - 1) / chunk : 0;
  checksums_[index].assign(static_cast<size_t>(num_chunks), 0);
  if (raw_) {
    open_->addresses.resize(static_cast<size_t>(num_chunks));
    for (int64_t c = 0; c < num_chunks; ++c) {
      const hsize_t coord[1] = {static_cast<hsize_t>(c * chunk)};
      unsigned filter_mask = 0;
      haddr_t address = HADDR_UNDEF;
      hsize_t bytes = 0;
      h5::check(H5Dget_chunk_info_by_coord(h5_->dataset.get(), coord, &filter_mask, &address, &bytes),
                context + ": H5Dget_chunk_info_by_coord");
      if (address == HADDR_UNDEF || bytes != static_cast<hsize_t>(chunk) * sizeof(float)) {
        fail(ErrorKind::kInternal, context + ": chunk " + std::to_string(c) + " has no allocated space");
      }
      open_->addresses[static_cast<size_t>(c)] = static_cast<int64_t>(address);
    }
  }
}

void ShardWriter::append(std::span<const float> data) {
  if (!open_) fail(ErrorKind::kInternal, where_ + ": append() without begin_state()");
  OpenState& st = *open_;
  if (static_cast<int64_t>(data.size()) > flat_size_ - st.received) {
    fail(ErrorKind::kInternal, where_ + ": more data than the state's " + std::to_string(flat_size_) + " elements");
  }
  st.received += static_cast<int64_t>(data.size());
  const size_t chunk = static_cast<size_t>(chunk_elems());
  std::vector<std::span<const float>> ready;
  // First complete the partial chunk left by the previous call, then take whole chunks straight
  // from the caller's memory; what is left waits for the next call.
  bool pending_full = false;
  if (!st.pending.empty()) {
    const size_t take = std::min(chunk - st.pending.size(), data.size());
    st.pending.insert(st.pending.end(), data.begin(), data.begin() + static_cast<long>(take));
    data = data.subspan(take);
    pending_full = st.pending.size() == chunk;
    if (pending_full) ready.push_back(st.pending);
  }
  while (chunk > 0 && data.size() >= chunk) {
    ready.push_back(data.first(chunk));
    data = data.subspan(chunk);
  }
  write_chunks(ready);
  if (pending_full) st.pending.clear();
  st.pending.insert(st.pending.end(), data.begin(), data.end());
}

void ShardWriter::end_state() {
  if (!open_) fail(ErrorKind::kInternal, where_ + ": end_state() without begin_state()");
  OpenState& st = *open_;
  if (st.received != flat_size_) {
    fail(ErrorKind::kInternal, where_ + ": state " + states_[st.index] + " got " + std::to_string(st.received) +
                                   " of its " + std::to_string(flat_size_) + " elements");
  }
  if (!st.pending.empty()) write_chunks({st.pending});  // the dataset's last, short chunk
  const std::string& name = states_[st.index];
  h5_->dataset.close(where_ + ": state " + name);
  const std::vector<uint64_t>& sums = checksums_[st.index];
  h5::write_uint64_dataset(h5_->checksum_group.get(), name.c_str(), sums.size(), sums.data(), where_);
  written_[st.index] = true;
  open_.reset();
}

void ShardWriter::write_chunks(const std::vector<std::span<const float>>& chunks) {
  if (chunks.empty()) return;
  OpenState& st = *open_;
  const hid_t dataset = h5_->dataset.get();
  uint64_t* checksums = checksums_[st.index].data();
  const int64_t chunk = chunk_elems();
  const size_t chunk_bytes = static_cast<size_t>(chunk) * sizeof(float);
  const std::string context = where_ + ": H5Dwrite_chunk";
  // HDF5 stores whole chunks, so a short last chunk is zero-padded; its checksum covers the valid
  // elements only. (Uncompressed chunks go around HDF5; compressed ones through H5Dwrite_chunk.)
  auto padded_copy = [&](std::span<const float> part, std::vector<std::byte>& out) {
    out.assign(chunk_bytes, std::byte{0});
    std::memcpy(out.data(), part.data(), part.size_bytes());
    return static_cast<const void*>(out.data());
  };
  const int64_t first = st.next_chunk;
  st.next_chunk += static_cast<int64_t>(chunks.size());
  // Durable shards start write-back every 64 MiB, so that the fsync in commit() finds little to do
  // (direct writes leave nothing behind in the page cache).
  unflushed_bytes_ += static_cast<int64_t>(chunks.size() * chunk_bytes);
  if (writeback_fd_.get() >= 0 && unflushed_bytes_ >= (int64_t{64} << 20) && !(raw_ && raw_->direct())) {
    start_writeback(writeback_fd_, 0, 0);
    unflushed_bytes_ = 0;
  }

  if (raw_) {
    // Each thread checksums and writes its chunks (zero-padding a short last one) at their addresses.
    pool_->parallel_for(chunks.size(), [&](size_t i, int worker) {
      const std::span<const float> part = chunks[i];
      const int64_t c = first + static_cast<int64_t>(i);
      checksums[c] = xxh64(part.data(), part.size_bytes());
      raw_->write(part.data(), part.size_bytes(), chunk_bytes, st.addresses[static_cast<size_t>(c)], worker);
    });
    return;
  }

  // Compressed: batches of chunks are compressed (and checksummed) in parallel, then written in order.
  const int workers = pool_->concurrency();
  compressors_.resize(static_cast<size_t>(workers));
  padded_.resize(static_cast<size_t>(workers));
  const size_t batch = static_cast<size_t>(workers) * 2;
  frames_.resize(batch);
  for (size_t b = 0; b < chunks.size(); b += batch) {
    const size_t count = std::min(batch, chunks.size() - b);
    pool_->parallel_for(count, [&](size_t i, int worker) {
      const std::span<const float> part = chunks[b + i];
      checksums[first + static_cast<int64_t>(b + i)] = xxh64(part.data(), part.size_bytes());
      auto& compressor = compressors_[static_cast<size_t>(worker)];
      if (!compressor) compressor = std::make_unique<ZstdCompressor>();
      const void* data =
          part.size_bytes() < chunk_bytes ? padded_copy(part, padded_[static_cast<size_t>(worker)]) : part.data();
      compressor->compress(data, chunk_bytes, options_.compression_level, frames_[i]);
    });
    for (size_t i = 0; i < count; ++i) {
      const hsize_t offset[1] = {static_cast<hsize_t>((first + static_cast<int64_t>(b + i)) * chunk)};
      h5::check(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, offset, frames_[i].size(), frames_[i].data()), context);
    }
  }
}

ShardRecord ShardWriter::commit() {
  for (size_t s = 0; s < states_.size(); ++s) {
    if (!written_[s]) fail(ErrorKind::kInternal, where_ + ": state " + states_[s] + " was never written");
  }
  open_.reset();
  h5_->state_group.close(where_);
  h5_->checksum_group.close(where_);
  h5_->file.close(where_ + ": closing the HDF5 file");  // flushes HDF5's metadata
  if (raw_) raw_->close();
  writeback_fd_.close();
  if (options_.durable) fsync_path(tmp_path_);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    fail_errno("rename " + tmp_path_.string() + " -> " + path_.string(), errno);
  }
  committed_ = true;
  if (options_.durable) fsync_directory(path_.parent_path().empty() ? "." : path_.parent_path());
  ShardRecord record;
  record.rank = rank_;
  record.file = path_.filename().string();
  record.bytes = static_cast<int64_t>(std::filesystem::file_size(path_));
  record.digest = shard_digest(states_, checksums_);
  return record;
}

}  // namespace shardkit::ckpt
