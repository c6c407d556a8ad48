#include "ckpt/zstd_codec.hpp"

#include <zstd.h>

#include <new>

#include "base/error.hpp"

namespace shardkit::ckpt {

ZstdCompressor::ZstdCompressor() : ctx_(ZSTD_createCCtx()) {
  if (!ctx_) throw std::bad_alloc();
}
ZstdCompressor::~ZstdCompressor() {
  ZSTD_freeCCtx(ctx_);
}

void ZstdCompressor::compress(const void* data, size_t size, int level, std::vector<std::byte>& out) {
  out.resize(ZSTD_compressBound(size));
  // ZSTD_compressCCtx writes a single frame with the content size in its header.
  const size_t n = ZSTD_compressCCtx(ctx_, out.data(), out.size(), data, size, level);
  if (ZSTD_isError(n)) fail(ErrorKind::kInternal, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
  out.resize(n);
}

ZstdDecompressor::ZstdDecompressor() : ctx_(ZSTD_createDCtx()) {
  if (!ctx_) throw std::bad_alloc();
}
ZstdDecompressor::~ZstdDecompressor() {
  ZSTD_freeDCtx(ctx_);
}

void ZstdDecompressor::decompress(const void* frame, size_t frame_size, void* out, size_t expected,
                                  const std::string& where) {
  const unsigned long long content = ZSTD_getFrameContentSize(frame, frame_size);
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content != expected) {
    fail(ErrorKind::kCorrupt, where + ": not a zstd frame of " + std::to_string(expected) + " bytes");
  }
  const size_t n = ZSTD_decompressDCtx(ctx_, out, expected, frame, frame_size);
  if (ZSTD_isError(n) || n != expected) {
    fail(ErrorKind::kCorrupt, where + ": zstd frame does not decode (" +
                                  std::string(ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output") + ")");
  }
}

bool is_valid_zstd_level(int level) noexcept {
  return level >= 1 && level <= 19;
}

}  // namespace shardkit::ckpt
