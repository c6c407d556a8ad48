// zstd compression of checkpoint chunks in the encoding of HDF5 filter 32015: every chunk is one
// zstd frame that records its decompressed size (see docs/FORMAT.md), so that any HDF5 zstd plugin
// (ours, hdf5plugin, HDF Group's) decodes it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace shardkit::ckpt {

inline constexpr int kZstdFilterId = 32015;

// Reusable compression context (RAII over ZSTD_CCtx).
class ZstdCompressor {
 public:
  ZstdCompressor();
  ~ZstdCompressor();
  ZstdCompressor(const ZstdCompressor&) = delete;
  ZstdCompressor& operator=(const ZstdCompressor&) = delete;

  // Compresses `size` bytes into one frame with content size; `out` is resized to the frame.
  void compress(const void* data, size_t size, int level, std::vector<std::byte>& out);

 private:
  ZSTD_CCtx_s* ctx_;
};

// Reusable decompression context (RAII over ZSTD_DCtx).
class ZstdDecompressor {
 public:
  ZstdDecompressor();
  ~ZstdDecompressor();
  ZstdDecompressor(const ZstdDecompressor&) = delete;
  ZstdDecompressor& operator=(const ZstdDecompressor&) = delete;

  // Decodes one frame that must expand to exactly `expected` bytes; Error(kCorrupt) naming `where`
  // otherwise.
  void decompress(const void* frame, size_t frame_size, void* out, size_t expected, const std::string& where);

 private:
  ZSTD_DCtx_s* ctx_;
};

// Valid compression levels: 1..19 (0 means "no compression" to the writer).
bool is_valid_zstd_level(int level) noexcept;

}  // namespace shardkit::ckpt
