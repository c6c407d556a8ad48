#include "model/cuda/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.hpp"

namespace shardkit::model::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
      fail(ErrorKind::kInternal, std::string("the CUDA driver has no cuTensorMapEncodeTiled (") +
                                     cudaGetErrorString(status) + "): the sm_90 kernels need a 12.0 driver or newer");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  return fn;
}

}  // namespace

CUtensorMap chunked_rows_map(const void* base, CUtensorMapDataType type, int64_t chunks, int64_t rows, int64_t batches,
                             int64_t row_bytes, int box_rows) {
  constexpr int kRank = 4;
  const cuuint64_t dims[kRank] = {kChunkElements, static_cast<cuuint64_t>(chunks), static_cast<cuuint64_t>(rows),
                                  static_cast<cuuint64_t>(batches)};
  const cuuint64_t strides[kRank - 1] = {kChunkRowBytes, static_cast<cuuint64_t>(row_bytes),
                                         static_cast<cuuint64_t>(row_bytes * rows)};
  const cuuint32_t box[kRank] = {kChunkElements, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[kRank] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult status = encode_tiled()(&map, type, kRank, const_cast<void*>(base), dims, strides, box,
                                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    fail(ErrorKind::kInternal, "cuTensorMapEncodeTiled refused a map of " + std::to_string(batches) + " x " +
                                   std::to_string(rows) + " rows of " + std::to_string(chunks) +
                                   " 64-element chunks, " + std::to_string(row_bytes) + " bytes apart (CUresult " +
                                   std::to_string(static_cast<int>(status)) + ")");
  }
  return map;
}

}  // namespace shardkit::model::cuda
