#include "ckpt/zstd_filter.hpp"

#include <zstd.h>

#include <climits>
#include <cstdlib>

namespace shardkit::ckpt {
namespace {

constexpr int kDefaultLevel = 3;

// H5Z_func_t: on success replaces *buf (allocated with malloc, as HDF5 frees it with free) and
// returns the number of valid bytes; on failure returns 0 and leaves *buf untouched.
size_t zstd_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes, size_t* buf_size,
                   void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    const unsigned long long content = ZSTD_getFrameContentSize(*buf, nbytes);
    // Chunks must be single frames with their size recorded (streamed frames are rejected).
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content == 0 ||
        content > SIZE_MAX) {
      return 0;
    }
    void* out = std::malloc(static_cast<size_t>(content));
    if (!out) return 0;
    const size_t n = ZSTD_decompress(out, static_cast<size_t>(content), *buf, nbytes);
    if (ZSTD_isError(n) || n != content) {
      std::free(out);
      return 0;
    }
    std::free(*buf);
    *buf = out;
    *buf_size = n;
    return n;
  }
  int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : kDefaultLevel;
  if (level < ZSTD_minCLevel()) level = ZSTD_minCLevel();
  if (level > ZSTD_maxCLevel()) level = ZSTD_maxCLevel();
  const size_t bound = ZSTD_compressBound(nbytes);
  void* out = std::malloc(bound);
  if (!out) return 0;
  const size_t n = ZSTD_compress(out, bound, *buf, nbytes, level);
  if (ZSTD_isError(n)) {
    std::free(out);
    return 0;
  }
  std::free(*buf);
  *buf = out;
  *buf_size = bound;
  return n;
}

}  // namespace

const H5Z_class2_t kZstdFilterClass = {
    H5Z_CLASS_T_VERS,                  // version
    static_cast<H5Z_filter_t>(32015),  // id (kZstdFilterId)
    1,                                 // encoder present
    1,                                 // decoder present
    "Zstandard (shardkit)",            // name
    nullptr,                           // can_apply
    nullptr,                           // set_local
    zstd_filter,                       // filter
};

}  // namespace shardkit::ckpt
