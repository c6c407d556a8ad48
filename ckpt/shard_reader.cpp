#include "ckpt/shard_reader.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "base/error.hpp"
#include "base/xxh64.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/shard_writer.hpp"

namespace shardkit::ckpt {

ShardReader::ShardReader(const std::filesystem::path& path, const ShardExpectation& expect)
    : where_(path.string()), table_(expect.table), states_(expect.states) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fail(ErrorKind::kCorrupt, where_ + ": shard file is missing (the manifest lists it)");
  }
  fd_ = open_input_file(path, ErrorKind::kCorrupt);
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
  fragments_ = layout.fragments(expect.rank);
  flat_size_ = layout.flat_size();
  chunk_elems_ = std::min(expect.chunk_elems, flat_size_);
  num_chunks_ = chunk_elems_ > 0 ? (flat_size_ + chunk_elems_ - 1) / chunk_elems_ : 0;

  ShardIndexRequest request;
  request.checkpoint_uid = expect.checkpoint_uid;
  request.layout_fingerprint = to_hex(layout_fingerprint(*expect.table, spec));
  request.step = expect.step;
  request.rank = expect.rank;
  request.world_size = spec.world_size;
  request.stage = spec.stage;
  request.alignment = spec.alignment;
  request.flat_size = flat_size_;
  request.manifest_chunk_elems = expect.chunk_elems;
  request.chunk_elems = chunk_elems_;
  request.num_chunks = num_chunks_;
  for (const Fragment& f : fragments_) {
    request.fragment_rows.insert(request.fragment_rows.end(), {f.tensor, f.tensor_offset, f.length, f.flat_offset});
  }
  request.states = states_;
  ShardIndex index = read_shard_index(fd_, request);
  chunks_ = std::move(index.chunks);
  checksums_ = std::move(index.checksums);
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
