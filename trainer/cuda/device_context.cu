#include "trainer/cuda/device_context.cuh"

namespace shardkit::trainer::cuda {

DeviceContext::DeviceContext(comm::MpiCollective& comm) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fail(ErrorKind::kInvalidInput, "--device cuda: no CUDA device is visible on this node");
  }
  device_ = comm.node_place().rank % count;
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
  stream_ = std::make_unique<Stream>();
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_->get()));
  // True fp32 for fp32 training (no TF32), tensor cores for bf16/fp16 inputs.
  CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  ncclUniqueId id;
  if (comm.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  comm.broadcast_bytes(&id, sizeof(id));
  NCCL_CHECK(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()));
}

DeviceContext::~DeviceContext() {
  if (nccl_ && !nccl_aborted(nccl_)) ncclCommDestroy(nccl_);
  if (cublas_) cublasDestroy(cublas_);
}

}  // namespace shardkit::trainer::cuda
