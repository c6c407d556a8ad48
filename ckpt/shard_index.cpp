#include "ckpt/shard_index.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <csignal>

#include "base/error.hpp"
#include "base/fault.hpp"
#include "ckpt/h5.hpp"
#include "ckpt/isolated_process.hpp"
#include "ckpt/shard_format.hpp"
#include "ckpt/zstd_codec.hpp"

namespace shardkit::ckpt {
namespace {

constexpr char kEntry[] = "shard-index";

// Time for one shard's metadata: opening it and locating every chunk takes milliseconds per thousand
// chunks; anything near this is a loop in crafted metadata.
constexpr double kSecondsPerShard = 60;

std::string encode(const ShardIndexRequest& r, const std::string& where) {
  isolated::Wire w;
  w.put_string(where);
  w.put_string(r.checkpoint_uid);
  w.put_string(r.layout_fingerprint);
  for (int64_t v : {r.step, r.rank, r.world_size, r.stage, r.alignment, r.flat_size, r.manifest_chunk_elems,
                    r.chunk_elems, r.num_chunks}) {
    w.put_i64(v);
  }
  w.put_array(r.fragment_rows);
  w.put_i64(static_cast<int64_t>(r.states.size()));
  for (const std::string& s : r.states) w.put_string(s);
  return w.take();
}

ShardIndexRequest decode(isolated::Wire& w) {
  ShardIndexRequest r;
  r.checkpoint_uid = w.get_string();
  r.layout_fingerprint = w.get_string();
  for (int64_t* v : {&r.step, &r.rank, &r.world_size, &r.stage, &r.alignment, &r.flat_size, &r.manifest_chunk_elems,
                     &r.chunk_elems, &r.num_chunks}) {
    *v = w.get_i64();
  }
  r.fragment_rows = w.get_array<int64_t>();
  const int64_t states = w.get_i64();
  if (states < 0 || states > static_cast<int64_t>(kMaxStates)) fail(ErrorKind::kInternal, "shard index: bad request");
  for (int64_t i = 0; i < states; ++i) r.states.push_back(w.get_string());
  return r;
}

// The links of `group` must be hard links named exactly `expected` (in any order).
void require_exactly(hid_t group, std::vector<std::string> expected, const std::string& where) {
  std::vector<std::string> found = h5::hard_link_names(group, expected.size(), where);
  std::sort(found.begin(), found.end());
  std::sort(expected.begin(), expected.end());
  for (const std::string& name : found) {
    if (!std::binary_search(expected.begin(), expected.end(), name)) {
      fail(ErrorKind::kCorrupt, where + ": unexpected object /" + name.substr(0, 64) + " (not in the shard schema)");
    }
  }
  for (const std::string& name : expected) {
    if (!std::binary_search(found.begin(), found.end(), name)) {
      fail(ErrorKind::kCorrupt, where + ": /" + name + " is missing");
    }
  }
}

// Runs in the isolated child: everything libhdf5 parses happens here.
std::string index_in_child(std::string_view request_bytes, int file_fd) {
  isolated::Wire in(request_bytes);
  const std::string where = in.get_string();
  const ShardIndexRequest expect = decode(in);
  // Test hooks for the containment itself: a parse that crashes or never ends.
  if (fault_armed("shard-index-crash", static_cast<int>(expect.rank), expect.step)) {
    std::signal(SIGSEGV, SIG_DFL);  // as libhdf5's own crash would end it, past a sanitizer's handler
    std::raise(SIGSEGV);
  }
  if (fault_armed("shard-index-hang", static_cast<int>(expect.rank), expect.step)) {
    for (volatile bool forever = true; forever;) {
    }
  }

  h5::Id file = h5::open_file("/proc/self/fd/" + std::to_string(file_fd), where);
  const hid_t root = file.get();
  require_exactly(
      root, {shard_path::kFragments, shard_path::kTensorNames, shard_path::kStateGroup, shard_path::kChecksumGroup},
      where);
  auto expect_int = [&](const char* name, int64_t expected) {
    const int64_t found = h5::read_int_attribute(root, name, where);
    if (found != expected) {
      fail(ErrorKind::kCorrupt,
           where + ": attribute " + name + " is " + std::to_string(found) + ", expected " + std::to_string(expected));
    }
  };
  const std::string format = h5::read_string_attribute(root, shard_attr::kFormat, where);
  if (format != kShardFormatName) {
    fail(ErrorKind::kCorrupt, where + ": not a shardkit shard (format '" + format.substr(0, 40) + "')");
  }
  const int64_t version = h5::read_int_attribute(root, shard_attr::kFormatVersion, where);
  if (version != kFormatVersion) {
    fail(ErrorKind::kCorrupt, where + ": shard format version " + std::to_string(version) +
                                  ", this build reads version " + std::to_string(kFormatVersion));
  }
  const std::string uid = h5::read_string_attribute(root, shard_attr::kCheckpointUid, where);
  if (uid != expect.checkpoint_uid) {
    fail(ErrorKind::kCorrupt, where + ": belongs to checkpoint " + uid.substr(0, 40) + ", the manifest is of " +
                                  expect.checkpoint_uid + " (a shard of another checkpoint)");
  }
  expect_int(shard_attr::kStep, expect.step);
  expect_int(shard_attr::kRank, expect.rank);
  expect_int(shard_attr::kWorldSize, expect.world_size);
  expect_int(shard_attr::kStage, expect.stage);
  expect_int(shard_attr::kAlignment, expect.alignment);
  expect_int(shard_attr::kFlatSize, expect.flat_size);
  expect_int(shard_attr::kChunkElems, expect.manifest_chunk_elems);
  if (h5::read_string_attribute(root, shard_attr::kLayoutFingerprint, where) != expect.layout_fingerprint) {
    fail(ErrorKind::kCorrupt, where + ": layout fingerprint differs from the manifest's tensor table and layout");
  }

  const size_t fragments = expect.fragment_rows.size() / 4;
  const std::vector<int64_t> rows = h5::read_int64_dataset(root, shard_path::kFragments, {fragments, 4}, where);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] != expect.fragment_rows[i]) {
      fail(ErrorKind::kCorrupt, where + ": fragment " + std::to_string(i / 4) + " disagrees with the layout");
    }
  }
  {
    h5::Id names = h5::open_dataset(root, shard_path::kTensorNames, where);
    h5::checked_storage(names.get(), where + ": dataset /" + shard_path::kTensorNames);
  }

  // HDF5 addresses are relative to the end of the user block (none in shardkit's own files).
  h5::Id fcpl = h5::check_id(H5Fget_create_plist(root), where + ": H5Fget_create_plist", ErrorKind::kCorrupt);
  hsize_t userblock = 0;
  h5::check(H5Pget_userblock(fcpl.get(), &userblock), where + ": H5Pget_userblock", ErrorKind::kCorrupt);
  struct stat st {};
  if (::fstat(file_fd, &st) != 0) fail_errno(where + ": fstat", errno);
  const int64_t file_size = st.st_size;
  const size_t chunk_bytes = static_cast<size_t>(expect.chunk_elems) * sizeof(float);

  h5::Id state_group = h5::open_group(root, shard_path::kStateGroup, where);
  h5::Id checksum_group = h5::open_group(root, shard_path::kChecksumGroup, where);
  require_exactly(state_group.get(), expect.states, where + " /state");
  require_exactly(checksum_group.get(), expect.states, where + " /checksum");
  isolated::Wire out;
  for (const std::string& name : expect.states) {
    const std::string context = where + ": state " + name;
    h5::Id dataset = h5::open_dataset(state_group.get(), name.c_str(), where + " /state");
    h5::Id type = h5::check_id(H5Dget_type(dataset.get()), context, ErrorKind::kCorrupt);
    if (H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0) fail(ErrorKind::kCorrupt, context + " is not little-endian fp32");
    if (h5::dataset_dims(dataset.get(), context) != std::vector<hsize_t>{static_cast<hsize_t>(expect.flat_size)}) {
      fail(ErrorKind::kCorrupt, context + " does not hold " + std::to_string(expect.flat_size) + " elements");
    }
    const std::vector<H5Z_filter_t> filters = h5::checked_storage(dataset.get(), context);
    const bool compressed = filters.size() == 1 && filters[0] == kZstdFilterId;
    if (!filters.empty() && !compressed) fail(ErrorKind::kCorrupt, context + " uses a filter other than zstd");
    if (expect.num_chunks > 0) {
      h5::Id dcpl = h5::check_id(H5Dget_create_plist(dataset.get()), context, ErrorKind::kCorrupt);
      hsize_t chunk_dim = 0;
      if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || H5Pget_chunk(dcpl.get(), 1, &chunk_dim) != 1 ||
          chunk_dim != static_cast<hsize_t>(expect.chunk_elems)) {
        fail(ErrorKind::kCorrupt, context + " is not chunked in " + std::to_string(expect.chunk_elems) + " elements");
      }
    }
    out.put_array(h5::read_uint64_dataset(checksum_group.get(), name.c_str(), static_cast<hsize_t>(expect.num_chunks),
                                          where + " /checksum"));
    std::vector<int64_t> addresses(static_cast<size_t>(expect.num_chunks));
    std::vector<int64_t> sizes(addresses.size());
    std::vector<int64_t> flags(addresses.size());
    for (int64_t c = 0; c < expect.num_chunks; ++c) {
      const hsize_t offset[1] = {static_cast<hsize_t>(c * expect.chunk_elems)};
      unsigned mask = 0;
      haddr_t address = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(dataset.get(), offset, &mask, &address, &size) < 0 || address == HADDR_UNDEF) {
        H5Eclear2(H5E_DEFAULT);
        fail(ErrorKind::kCorrupt, context + " chunk " + std::to_string(c) + " was never written");
      }
      const auto i = static_cast<size_t>(c);
      const bool chunk_compressed = compressed && (mask & 1u) == 0;
      const bool size_ok =
          chunk_compressed ? size > 0 && size <= chunk_bytes + chunk_bytes / 8 + 1024 : size == chunk_bytes;
      const auto end = static_cast<haddr_t>(file_size);
      if (!size_ok || size > end || address > end || userblock > end || address + userblock > end - size) {
        fail(ErrorKind::kCorrupt, context + " chunk " + std::to_string(c) + " lies outside the file (truncated?)");
      }
      addresses[i] = static_cast<int64_t>(address + userblock);
      sizes[i] = static_cast<int64_t>(size);
      flags[i] = chunk_compressed ? 1 : 0;
    }
    out.put_array(addresses);
    out.put_array(sizes);
    out.put_array(flags);
  }
  return out.take();
}

SHARDKIT_ISOLATED_ENTRY(kEntry, index_in_child)

}  // namespace

ShardIndex read_shard_index(const FileDescriptor& file, const ShardIndexRequest& request) {
  const std::string where = file.path().string();
  isolated::Limits limits;
  limits.seconds = kSecondsPerShard;
  // Per chunk and state: a checksum, an address, a size and a flag, eight bytes each.
  limits.max_response_bytes = static_cast<int64_t>(request.states.size()) * (request.num_chunks * 32 + 64) + 1024;
  const std::string response =
      isolated::run(kEntry, encode(request, where), file.get(), where, "reading its HDF5 metadata", limits);
  isolated::Wire in(response);
  ShardIndex index;
  const auto chunks = static_cast<size_t>(request.num_chunks);
  for (size_t s = 0; s < request.states.size(); ++s) {
    std::vector<uint64_t> checksums = in.get_array<uint64_t>();
    const std::vector<int64_t> addresses = in.get_array<int64_t>();
    const std::vector<int64_t> sizes = in.get_array<int64_t>();
    const std::vector<int64_t> flags = in.get_array<int64_t>();
    if (checksums.size() != chunks || addresses.size() != chunks || sizes.size() != chunks || flags.size() != chunks) {
      fail(ErrorKind::kInternal, where + ": shard index answer of the wrong size");
    }
    std::vector<ChunkLocation> locations(chunks);
    for (size_t c = 0; c < chunks; ++c) locations[c] = {addresses[c], sizes[c], flags[c] != 0};
    index.chunks.push_back(std::move(locations));
    index.checksums.push_back(std::move(checksums));
  }
  if (!in.at_end()) fail(ErrorKind::kInternal, where + ": shard index answer of the wrong size");
  return index;
}

}  // namespace shardkit::ckpt
