// Entry points of the loadable HDF5 filter plugin: HDF5 finds libshardkit_h5zstd.so through
// HDF5_PLUGIN_PATH and asks it for the filter class (32015, Zstandard).
#include <H5PLextern.h>

#include "ckpt/zstd_filter.hpp"

extern "C" {

H5PL_type_t H5PLget_plugin_type(void) {
  return H5PL_TYPE_FILTER;
}

const void* H5PLget_plugin_info(void) {
  return &shardkit::ckpt::kZstdFilterClass;
}

}  // extern "C"
