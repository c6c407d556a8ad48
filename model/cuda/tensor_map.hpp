// Tensor maps (the copy engine's descriptors of a global tensor and the box one copy moves) for the
// row-major activations of the sm_90 kernels, built on the host through the driver's entry point
// (reached through the runtime, so nothing links libcuda).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace shardkit::model::cuda {

// The shared-memory tile layout of the sm_90 kernels (model/cuda/sm90.cuh): rows of 64 16-bit elements,
// 128 bytes, swizzled in atoms of 8 rows.
constexpr int kChunkElements = 64;
constexpr int kChunkRowBytes = 128;
constexpr int kAtomBytes = 8 * kChunkRowBytes;

// `batches` blocks of `rows` rows of 16-bit values, rows `row_bytes` apart, each row read as `chunks`
// consecutive chunks of 64 elements: the dimensions (element, chunk, row, batch), innermost first. A
// box is one chunk of `box_rows` rows -- 128 bytes a row, 128-byte swizzled, the layout of
// model/cuda/sm90.cuh -- and rows past `rows` of a batch arrive as zeros. Fails with the driver's
// reason if the map is refused (an unaligned base or row stride).
CUtensorMap chunked_rows_map(const void* base, CUtensorMapDataType type, int64_t chunks, int64_t rows, int64_t batches,
                             int64_t row_bytes, int box_rows);

}  // namespace shardkit::model::cuda
