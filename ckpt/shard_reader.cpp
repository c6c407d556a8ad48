#include "ckpt/shard_reader.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "ckpt/checksum.hpp"
#include "ckpt/error.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/shard_writer.hpp"

namespace shardkit::ckpt {

ShardReader::ShardReader(const std::filesystem::path& path, const ShardExpectation& expect)
    : where_(path.string()), table_(expect.table), states_(expect.states) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    fail(ErrorKind::kCorrupt, where_ + ": shard file is missing (the manifest lists it)");
  }
  fd_ = FileDescriptor(path, O_RDONLY);
  const int64_t size = fd_.size();
  if (size != expect.bytes) {
    fail(ErrorKind::kCorrupt, where_ + ": " + std::to_string(size) + " bytes, the manifest expects " +
                                  std::to_string(expect.bytes) + (size < expect.bytes ? " (truncated)" : ""));
  }
  index_file(expect);
}

void ShardReader::index_file(const ShardExpectation& expect) {
  const Layout& layout = *expect.layout;
  const LayoutSpec& spec = layout.spec();
  h5::Id file = h5::open_file(fd_.path());
  const hid_t root = file.get();
  auto expect_int = [&](const char* name, int64_t expected) {
    const int64_t found = h5::read_int_attribute(root, name, where_);
    if (found != expected) {
      fail(ErrorKind::kCorrupt,
           where_ + ": attribute " + name + " is " + std::to_string(found) + ", expected " + std::to_string(expected));
    }
  };
  const std::string format = h5::read_string_attribute(root, shard_attr::kFormat, where_);
  if (format != kShardFormatName) {
    fail(ErrorKind::kCorrupt, where_ + ": not a shardkit shard (format '" + format.substr(0, 40) + "')");
  }
  const int64_t version = h5::read_int_attribute(root, shard_attr::kFormatVersion, where_);
  if (version != kFormatVersion) {
    fail(ErrorKind::kCorrupt, where_ + ": shard format version " + std::to_string(version) +
                                  ", this build reads version " + std::to_string(kFormatVersion));
  }
  const std::string uid = h5::read_string_attribute(root, shard_attr::kCheckpointUid, where_);
  if (uid != expect.checkpoint_uid) {
    fail(ErrorKind::kCorrupt, where_ + ": belongs to checkpoint " + uid.substr(0, 40) + ", the manifest is of " +
                                  expect.checkpoint_uid + " (a shard of another checkpoint)");
  }
  expect_int(shard_attr::kStep, expect.step);
  expect_int(shard_attr::kRank, expect.rank);
  expect_int(shard_attr::kWorldSize, spec.world_size);
  expect_int(shard_attr::kStage, spec.stage);
  expect_int(shard_attr::kAlignment, spec.alignment);
  expect_int(shard_attr::kFlatSize, layout.flat_size());
  expect_int(shard_attr::kChunkElems, expect.chunk_elems);
  const std::string fingerprint = h5::read_string_attribute(root, shard_attr::kLayoutFingerprint, where_);
  if (fingerprint != to_hex(layout_fingerprint(*expect.table, spec))) {
    fail(ErrorKind::kCorrupt, where_ + ": layout fingerprint differs from the manifest's tensor table and layout");
  }

  fragments_ = layout.fragments(expect.rank);
  const std::vector<int64_t> rows =
      h5::read_int64_dataset(root, shard_path::kFragments, {fragments_.size(), 4}, where_);
  for (size_t i = 0; i < fragments_.size(); ++i) {
    const Fragment& f = fragments_[i];
    if (rows[4 * i] != f.tensor || rows[4 * i + 1] != f.tensor_offset || rows[4 * i + 2] != f.length ||
        rows[4 * i + 3] != f.flat_offset) {
      fail(ErrorKind::kCorrupt, where_ + ": fragment " + std::to_string(i) + " disagrees with the layout");
    }
  }

  flat_size_ = layout.flat_size();
  chunk_elems_ = std::min(expect.chunk_elems, flat_size_);
  num_chunks_ = chunk_elems_ > 0 ? (flat_size_ + chunk_elems_ - 1) / chunk_elems_ : 0;
  const size_t chunk_bytes = static_cast<size_t>(chunk_elems_) * sizeof(float);
  // HDF5 addresses are relative to the end of the user block (none in shardkit's own files).
  h5::Id fcpl = h5::check_id(H5Fget_create_plist(root), where_ + ": H5Fget_create_plist", ErrorKind::kCorrupt);
  hsize_t userblock = 0;
  h5::check(H5Pget_userblock(fcpl.get(), &userblock), where_ + ": H5Pget_userblock", ErrorKind::kCorrupt);
  const int64_t file_size = fd_.size();

  h5::Id state_group = h5::check_id(H5Gopen2(root, shard_path::kStateGroup, H5P_DEFAULT),
                                    where_ + ": group /state is missing", ErrorKind::kCorrupt);
  h5::Id checksum_group = h5::check_id(H5Gopen2(root, shard_path::kChecksumGroup, H5P_DEFAULT),
                                       where_ + ": group /checksum is missing", ErrorKind::kCorrupt);
  chunks_.resize(states_.size());
  checksums_.resize(states_.size());
  for (size_t s = 0; s < states_.size(); ++s) {
    const std::string& name = states_[s];
    const std::string context = where_ + ": state " + name;
    h5::Id dataset = h5::open_dataset(state_group.get(), name.c_str(), where_ + " /state");
    h5::Id type = h5::check_id(H5Dget_type(dataset.get()), context, ErrorKind::kCorrupt);
    if (H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0) fail(ErrorKind::kCorrupt, context + " is not little-endian fp32");
    if (h5::dataset_dims(dataset.get(), context) != std::vector<hsize_t>{static_cast<hsize_t>(flat_size_)}) {
      fail(ErrorKind::kCorrupt, context + " does not hold " + std::to_string(flat_size_) + " elements");
    }
    h5::Id dcpl = h5::check_id(H5Dget_create_plist(dataset.get()), context, ErrorKind::kCorrupt);
    bool compressed = false;
    if (num_chunks_ > 0) {
      hsize_t chunk_dim = 0;
      if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || H5Pget_chunk(dcpl.get(), 1, &chunk_dim) != 1 ||
          chunk_dim != static_cast<hsize_t>(chunk_elems_)) {
        fail(ErrorKind::kCorrupt, context + " is not chunked in " + std::to_string(chunk_elems_) + " elements");
      }
      const int filters = H5Pget_nfilters(dcpl.get());
      if (filters == 1) {
        unsigned flags = 0;
        size_t nelmts = 0;
        unsigned values[4];
        unsigned config = 0;
        const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), 0, &flags, &nelmts, values, 0, nullptr, &config);
        compressed = id == kZstdFilterId;
      }
      if (filters != 0 && !compressed) fail(ErrorKind::kCorrupt, context + " uses a filter other than zstd");
    }
    checksums_[s] = h5::read_uint64_dataset(checksum_group.get(), name.c_str(), static_cast<hsize_t>(num_chunks_),
                                            where_ + " /checksum");
    std::vector<ChunkLocation>& locations = chunks_[s];
    locations.resize(static_cast<size_t>(num_chunks_));
    for (int64_t c = 0; c < num_chunks_; ++c) {
      const hsize_t offset[1] = {static_cast<hsize_t>(c * chunk_elems_)};
      unsigned mask = 0;
      haddr_t address = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(dataset.get(), offset, &mask, &address, &size) < 0 || address == HADDR_UNDEF) {
        H5Eclear2(H5E_DEFAULT);
        fail(ErrorKind::kCorrupt, context + " chunk " + std::to_string(c) + " was never written");
      }
      ChunkLocation& loc = locations[static_cast<size_t>(c)];
      loc.address = static_cast<int64_t>(address + userblock);
      loc.size = static_cast<int64_t>(size);
      loc.compressed = compressed && (mask & 1u) == 0;
      const bool size_ok = loc.compressed ? loc.size > 0 : loc.size == static_cast<int64_t>(chunk_bytes);
      if (!size_ok || loc.address < 0 || loc.address > file_size - loc.size) {
        fail(ErrorKind::kCorrupt, context + " chunk " + std::to_string(c) + " lies outside the file (truncated?)");
      }
    }
  }
  if (shard_digest(states_, checksums_) != expect.digest) {
    fail(ErrorKind::kCorrupt, where_ + ": chunk checksums do not match the manifest's digest for this shard");
  }
}

int64_t ShardReader::valid_elements(int64_t chunk) const noexcept {
  return std::min(chunk_elems_, flat_size_ - chunk * chunk_elems_);
}

int64_t ShardReader::chunk_storage_bytes(size_t state, int64_t chunk) const {
  return chunks_[state][static_cast<size_t>(chunk)].size;
}

void ShardReader::load_chunk(size_t state, int64_t chunk, float* out, Scratch& scratch) const {
  const ChunkLocation& loc = chunks_[state][static_cast<size_t>(chunk)];
  const size_t chunk_bytes = static_cast<size_t>(chunk_elems_) * sizeof(float);
  const std::string context = where_ + ": state " + states_[state] + " chunk " + std::to_string(chunk);
  if (loc.compressed) {
    scratch.raw.resize(static_cast<size_t>(loc.size));
    fd_.pread_exact(scratch.raw.data(), scratch.raw.size(), loc.address);
    scratch.decompressor.decompress(scratch.raw.data(), scratch.raw.size(), out, chunk_bytes, context);
  } else {
    fd_.pread_exact(out, chunk_bytes, loc.address);
  }
  const int64_t valid = valid_elements(chunk);
  const uint64_t sum = xxh64(out, static_cast<size_t>(valid) * sizeof(float));
  const uint64_t stored = checksums_[state][static_cast<size_t>(chunk)];
  if (sum != stored) {
    const int64_t lo = chunk * chunk_elems_;
    fail(ErrorKind::kCorrupt, context + " (flat elements " + std::to_string(lo) + ".." + std::to_string(lo + valid) +
                                  ", " + describe_flat_range(lo, lo + valid) + "): checksum mismatch (stored " +
                                  to_hex(stored) + ", computed " + to_hex(sum) + ")");
  }
}

const float* ShardReader::decoded_chunk(size_t state, int64_t chunk, Scratch& scratch) const {
  if (scratch.owner != this || scratch.state != state || scratch.chunk != chunk) {
    scratch.decoded.resize(static_cast<size_t>(chunk_elems_));
    scratch.chunk = -1;  // invalid until the chunk has been read and checked
    load_chunk(state, chunk, scratch.decoded.data(), scratch);
    scratch.owner = this;
    scratch.state = state;
    scratch.chunk = chunk;
  }
  return scratch.decoded.data();
}

std::string ShardReader::check_chunk(size_t state, int64_t chunk, Scratch& scratch) const {
  try {
    decoded_chunk(state, chunk, scratch);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

void ShardReader::read_chunk(size_t state, int64_t chunk, std::span<const Piece> pieces, Scratch& scratch) const {
  const int64_t lo = chunk * chunk_elems_;
  if (state >= states_.size() || chunk < 0 || chunk >= num_chunks_) {
    fail(ErrorKind::kInternal, where_ + ": read of a chunk outside the flat buffer");
  }
  for (const Piece& p : pieces) {
    if (p.flat_offset < lo || p.length < 0 || p.flat_offset + p.length > lo + valid_elements(chunk)) {
      fail(ErrorKind::kInternal, where_ + ": read piece outside chunk " + std::to_string(chunk));
    }
  }
  if (pieces.size() == 1 && pieces[0].length == chunk_elems_) {
    load_chunk(state, chunk, pieces[0].out, scratch);
    return;
  }
  const float* decoded = decoded_chunk(state, chunk, scratch);
  for (const Piece& p : pieces) {
    std::memcpy(p.out, decoded + (p.flat_offset - lo), static_cast<size_t>(p.length) * sizeof(float));
  }
}

std::string ShardReader::describe_flat_range(int64_t lo, int64_t hi) const {
  std::string out;
  int listed = 0;
  int more = 0;
  for (const Fragment& f : fragments_) {
    const int64_t begin = std::max(lo, f.flat_offset);
    const int64_t end = std::min(hi, f.flat_offset + f.length);
    if (begin >= end) continue;
    if (listed == 3) {
      ++more;
      continue;
    }
    const int64_t t0 = f.tensor_offset + (begin - f.flat_offset);
    const int64_t t1 = t0 + (end - begin);
    out += (out.empty() ? "tensor " : ", tensor ") + (*table_)[static_cast<size_t>(f.tensor)].name + "[" +
           std::to_string(t0) + ":" + std::to_string(t1) + "]";
    ++listed;
  }
  if (more > 0) out += " and " + std::to_string(more) + " more";
  return out.empty() ? "padding only" : out;
}

}  // namespace shardkit::ckpt
