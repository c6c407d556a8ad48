#include "ckpt/shard_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "ckpt/checksum.hpp"
#include "ckpt/error.hpp"
#include "ckpt/file_util.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/thread_pool.hpp"
#include "ckpt/zstd_codec.hpp"

namespace shardkit::ckpt {

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
      written_(states.size(), false) {
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
  if (options.compression_level > 0) pool_ = std::make_unique<ThreadPool>(ThreadPool::default_threads(options.threads));

  file_ = h5::create_file(tmp_path_);
  const hid_t root = file_.get();
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

  state_group_ = h5::create_group(root, shard_path::kStateGroup, where_);
  checksum_group_ = h5::create_group(root, shard_path::kChecksumGroup, where_);
}

ShardWriter::~ShardWriter() {
  if (committed_) return;
  state_group_ = h5::Id();
  checksum_group_ = h5::Id();
  file_ = h5::Id();
  std::error_code ec;
  std::filesystem::remove(tmp_path_, ec);
}

void ShardWriter::write_state(std::string_view state, std::span<const float> flat) {
  const auto it = std::find(states_.begin(), states_.end(), state);
  if (it == states_.end()) fail(ErrorKind::kInternal, where_ + ": state " + std::string(state) + " was not declared");
  const size_t index = static_cast<size_t>(it - states_.begin());
  if (written_[index]) fail(ErrorKind::kInternal, where_ + ": state " + std::string(state) + " written twice");
  if (static_cast<int64_t>(flat.size()) != flat_size_) {
    fail(ErrorKind::kInternal, where_ + ": state " + std::string(state) + " has " + std::to_string(flat.size()) +
                                   " elements, the layout gives this rank " + std::to_string(flat_size_));
  }
  const std::string name(state);
  const std::string context = where_ + ": state " + name;
  const hsize_t dims[1] = {static_cast<hsize_t>(flat_size_)};
  h5::Id space = h5::check_id(H5Screate_simple(1, dims, nullptr), "H5Screate_simple");
  h5::Id dcpl = h5::check_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
  const int64_t chunk = std::min(chunk_elems_, flat_size_);
  if (chunk > 0) {
    const hsize_t chunk_dims[1] = {static_cast<hsize_t>(chunk)};
    h5::check(H5Pset_chunk(dcpl.get(), 1, chunk_dims), context + ": H5Pset_chunk");
    // Chunks are written whole with H5Dwrite_chunk; no fill values are ever needed.
    h5::check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), context + ": H5Pset_fill_time");
    if (options_.compression_level > 0) {
      const unsigned level = static_cast<unsigned>(options_.compression_level);
      h5::check(H5Pset_filter(dcpl.get(), kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level),
                context + ": H5Pset_filter(zstd)");
    }
  }
  h5::Id dataset = h5::check_id(
      H5Dcreate2(state_group_.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
      context + ": cannot create dataset");
  const int64_t num_chunks = chunk > 0 ? (flat_size_ + chunk - 1) / chunk : 0;
  std::vector<uint64_t>& sums = checksums_[index];
  sums.assign(static_cast<size_t>(num_chunks), 0);
  if (num_chunks > 0) write_chunks(dataset.get(), flat, sums.data());
  dataset.close(context);
  h5::write_uint64_dataset(checksum_group_.get(), name.c_str(), sums.size(), sums.data(), where_);
  written_[index] = true;
}

void ShardWriter::write_chunks(hid_t dataset, std::span<const float> flat, uint64_t* checksums) {
  const int64_t chunk = std::min(chunk_elems_, flat_size_);
  const size_t chunk_bytes = static_cast<size_t>(chunk) * sizeof(float);
  const int64_t num_chunks = (flat_size_ + chunk - 1) / chunk;
  const std::string context = where_ + ": H5Dwrite_chunk";
  // The last chunk may be partial: HDF5 stores whole chunks, so it is zero-padded. Its checksum
  // covers the valid elements only.
  auto chunk_span = [&](int64_t c) {
    const int64_t begin = c * chunk;
    return flat.subspan(static_cast<size_t>(begin), static_cast<size_t>(std::min(chunk, flat_size_ - begin)));
  };
  auto padded_copy = [&](std::span<const float> part, std::vector<std::byte>& out) {
    out.assign(chunk_bytes, std::byte{0});
    std::memcpy(out.data(), part.data(), part.size_bytes());
  };

  if (options_.compression_level == 0) {
    std::vector<std::byte> padded;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const std::span<const float> part = chunk_span(c);
      checksums[c] = xxh64(part.data(), part.size_bytes());
      const void* data = part.data();
      if (part.size_bytes() < chunk_bytes) {
        padded_copy(part, padded);
        data = padded.data();
      }
      const hsize_t offset[1] = {static_cast<hsize_t>(c * chunk)};
      h5::check(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, offset, chunk_bytes, data), context);
    }
    return;
  }

  // Compressed: a batch of chunks is compressed (and checksummed) in parallel, then written in order.
  const int workers = pool_->concurrency();
  const int64_t batch = int64_t{workers} * 2;
  std::vector<std::unique_ptr<ZstdCompressor>> compressors(static_cast<size_t>(workers));
  std::vector<std::vector<std::byte>> padded(static_cast<size_t>(workers));
  std::vector<std::vector<std::byte>> frames(static_cast<size_t>(batch));
  for (int64_t first = 0; first < num_chunks; first += batch) {
    const int64_t count = std::min(batch, num_chunks - first);
    pool_->parallel_for(static_cast<size_t>(count), [&](size_t i, int worker) {
      const int64_t c = first + static_cast<int64_t>(i);
      const std::span<const float> part = chunk_span(c);
      checksums[c] = xxh64(part.data(), part.size_bytes());
      auto& compressor = compressors[static_cast<size_t>(worker)];
      if (!compressor) compressor = std::make_unique<ZstdCompressor>();
      const void* data = part.data();
      if (part.size_bytes() < chunk_bytes) {
        padded_copy(part, padded[static_cast<size_t>(worker)]);
        data = padded[static_cast<size_t>(worker)].data();
      }
      compressor->compress(data, chunk_bytes, options_.compression_level, frames[i]);
    });
    for (int64_t i = 0; i < count; ++i) {
      const hsize_t offset[1] = {static_cast<hsize_t>((first + i) * chunk)};
      const std::vector<std::byte>& frame = frames[static_cast<size_t>(i)];
      h5::check(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, offset, frame.size(), frame.data()), context);
    }
  }
}

ShardRecord ShardWriter::commit() {
  for (size_t s = 0; s < states_.size(); ++s) {
    if (!written_[s]) fail(ErrorKind::kInternal, where_ + ": state " + states_[s] + " was never written");
  }
  state_group_.close(where_);
  checksum_group_.close(where_);
  file_.close(where_ + ": closing the HDF5 file");  // flushes HDF5's metadata
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
