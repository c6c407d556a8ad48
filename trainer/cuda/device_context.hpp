// One rank's GPU: the device its node-local MPI rank picks, a compute stream on it, a cuBLAS handle
// bound to that stream and an NCCL communicator over the MPI world (rank 0 creates the id, MPI carries
// it), or, for ranks that never reduce on the device (evaluation), no communicator. The trainer's backend, evaluation,
// the multi-rank CUDA tests and the communication benchmark start here.
#pragma once

#include <memory>

#include "comm/mpi.hpp"
#include "model/cuda/cuda_common.hpp"
#include "trainer/cuda/nccl.hpp"

namespace shardkit::trainer::cuda {

class DeviceContext {
 public:
  enum class Collectives { kNccl, kNone };
  // Error(kInvalidInput) when no CUDA device is visible, or when two ranks took one GPU. Collective.
  explicit DeviceContext(comm::MpiCollective& comm, Collectives collectives = Collectives::kNccl);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const noexcept { return device_; }
  const cudaDeviceProp& props() const noexcept { return props_; }
  cudaStream_t stream() const noexcept { return stream_->get(); }
  cublasHandle_t cublas() const noexcept { return cublas_; }
  ncclComm_t nccl() const noexcept { return nccl_.get(); }

 private:
  void open(int device);  // the device, its stream and cuBLAS handle

  int device_ = 0;
  cudaDeviceProp props_{};
  std::unique_ptr<model::cuda::Stream> stream_;  // created once the device is chosen: a stream belongs to one device
  cublasHandle_t cublas_ = nullptr;
  NcclComm nccl_;
};

}  // namespace shardkit::trainer::cuda
