// The building blocks of the sm_90 kernels (model/cuda/sm90_tiles.cuh), one at a time, in one-block
// kernels: a tile through the copy engine and back out of its swizzled layout, and each kind of
// warpgroup product. A wrong descriptor, swizzle or fragment layout shows up here as a wrong matrix
// with a simple shape rather than as a wrong attention output. Each queues its kernel on the default
// stream (wait with device_values.hpp's finish_within); they need a compute capability 9.0 device.
#pragma once

#include <cstdint>

namespace shardkit::testing::sm90_probes {

// Rows [row, row + box_rows) of batch `batch` of a (batches x rows x chunks * 64) tensor of 16-bit
// values (rows row_elements apart), chunks [first_chunk, first_chunk + hs / 64), copied into shared
// memory by the copy engine and read back out of its swizzle into out (box_rows x hs, row-major);
// rows past `rows` arrive as zeros. hs: 64 or 128.
void tma_round_trip(uint16_t* out, const uint16_t* src, int64_t chunks, int64_t rows, int64_t batches,
                    int64_t row_elements, int box_rows, int hs, int first_chunk, int row, int batch);

// out (64 x n, fp32, row-major) = a (64 x hs) * b^T (b: n x hs), a and b bf16 row-major in device
// memory, through the copy engine and product_abt. n and hs: 64 or 128.
void product_abt(float* out, const uint16_t* a, const uint16_t* b, int n, int hs);

// out (64 x hs, fp32) = round_bf16(p) (64 x k, fp32 row-major) * b (k x hs, bf16 row-major), p turned
// into register fragments (fragments.cuh's to_fragments) and b through the copy engine, product_pb.
// k and hs: 64 or 128.
void product_pb(float* out, const float* p, const uint16_t* b, int k, int hs);

}  // namespace shardkit::testing::sm90_probes
