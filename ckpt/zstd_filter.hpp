// HDF5 filter 32015 (Zstandard): the filter class shared by the in-process registration and the
// loadable plugin (libshardkit_h5zstd.so, for h5dump, h5py and HDFView). It calls zstd only, never
// HDF5, so the plugin loads into any HDF5 build.
#pragma once

#include <hdf5.h>

namespace shardkit::ckpt {

extern const H5Z_class2_t kZstdFilterClass;

}  // namespace shardkit::ckpt
