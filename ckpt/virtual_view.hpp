// A zero-copy consolidated view of a checkpoint: one small HDF5 file of virtual datasets (HDF5 VDS)
// that presents every full tensor of every state in its own shape, mapped element range by element
// range onto /state/<s> of the shard files, so that h5py or any HDF5 1.10+ reader sees whole tensors
// without a byte of the data being copied.
//
// File contents:
//   /                      attributes format = "shardkit-virtual-view", format_version = 1, step,
//                          checkpoint_uid, model (the manifest's model object as a JSON string) and
//                          source (the step directory as the source paths name it, relative to the
//                          view's directory; "." when the view lies in the step directory)
//   /<state>/<tensor>      float32 virtual dataset in the tensor's shape; a scalar (shape []) is a
//                          0-dimensional dataset (h5py shape ()), an empty tensor an empty dataset
//
// How readers find the shards (HDF5 1.10.8 and h5py 3.7 on it, checked by experiment): a relative
// source file name is tried, in this order, (1) under each ':'-separated prefix of the environment
// variable HDF5_VDS_PREFIX if it is set, otherwise under the dataset access property
// H5Pset_virtual_prefix (in both, a leading "${ORIGIN}" stands for the view's directory), (2) relative
// to the directory of the view file as the reader opened it, and (3) relative to the reader's current
// working directory. "${ORIGIN}" is not expanded inside a stored file name. So the view stores shard
// paths relative to its own directory, computed from the canonical (symlink-free) paths of both: step
// (2) finds them from any working directory, and moving the checkpoint and the view together keeps
// the view working (moving only one breaks it). A '%' is stored as "%%": HDF5 reads source names as
// printf-like patterns.
//
// Reading through the view bypasses shardkit's per-chunk XXH64 checks (HDF5 still checks its own
// metadata); `shardkit verify` checks the data. A shard that cannot be opened at read time is not an
// error in HDF5 1.10: its elements read as the fill value, which the view sets to NaN so that they
// cannot pass for data. (Caveat of step (3): if the reader's working directory happens to hold a file
// at the same relative path, HDF5 reads that one instead.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace shardkit::ckpt {

inline constexpr const char* kVirtualViewFormatName = "shardkit-virtual-view";
inline constexpr int64_t kVirtualViewFormatVersion = 1;

struct VirtualViewOptions {
  std::vector<std::string> states;  // which states to present, in this order (empty = all, manifest order)
};

// Writes the view of `checkpoint` (a step directory, or a run directory whose `latest` is followed) to
// `out_file`. The shards are validated first (size, identity, fragment table, digest; not the data
// checksums), so a view is never written over a missing or foreign shard. `out_file` must not exist;
// missing parent directories are created; the file is written as out_file + ".tmp", fsynced and
// renamed when complete. Error(kInvalidInput) for an existing `out_file` or an unknown or repeated
// state. Returns the number of virtual datasets written (states x tensors).
int64_t write_virtual_view(const std::filesystem::path& checkpoint, const std::filesystem::path& out_file,
                           const VirtualViewOptions& options = {});

}  // namespace shardkit::ckpt
