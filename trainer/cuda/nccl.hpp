// NCCL's error check and communicator owner, and the wait on a stream that watches the communicator
// (the trainer's collectives; the CUDA and cuBLAS counterparts are model/cuda/cuda_common.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "model/cuda/cuda_common.hpp"

#define NCCL_CHECK(call)                                                                                           \
  do {                                                                                                             \
    const ncclResult_t e_ = (call);                                                                                \
    if (e_ != ncclSuccess) ::shardkit::model::cuda::throw_cuda(#call, ncclGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)

namespace shardkit::trainer::cuda {

// Blocks until `stream` has finished, checking `comm` meanwhile: NCCL reports a failed peer or
// network asynchronously and leaves collectives waiting forever, and a rank that stalls leaves the
// others waiting too. On an asynchronous NCCL error, or when the stream makes no progress for
// comm::collective_timeout_seconds() (SHARDKIT_COLLECTIVE_TIMEOUT, default 600), the communicator is
// aborted and Error(kIo) says why; the command line then ends the job on every rank instead of hanging.
void wait_checking_nccl(cudaStream_t stream, ncclComm_t comm);
// Whether wait_checking_nccl aborted `comm` (then it must not be destroyed again).
bool nccl_aborted(ncclComm_t comm);

// An NCCL communicator, destroyed with its owner -- unless wait_checking_nccl aborted it, which frees it.
class NcclComm {
 public:
  NcclComm() = default;
  ~NcclComm() {
    if (comm_ && !nccl_aborted(comm_)) ncclCommDestroy(comm_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // Where ncclCommInitRank or ncclCommSplit puts the communicator this one owns.
  ncclComm_t* out() noexcept { return &comm_; }
  ncclComm_t get() const noexcept { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

// NCCL's name of the compute type T (float, __nv_bfloat16 or __half).
template <typename T>
struct NcclType;
template <>
struct NcclType<float> {
  static constexpr ncclDataType_t kValue = ncclFloat;
};
template <>
struct NcclType<__nv_bfloat16> {
  static constexpr ncclDataType_t kValue = ncclBfloat16;
};
template <>
struct NcclType<__half> {
  static constexpr ncclDataType_t kValue = ncclHalf;
};

}  // namespace shardkit::trainer::cuda
