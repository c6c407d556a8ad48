#include "trainer/cuda/device_context.hpp"

#include <map>
#include <string>
#include <vector>

namespace shardkit::trainer::cuda {

using model::cuda::Stream;

namespace {

// Two ranks on one GPU end in NCCL's "invalid usage" deep inside its set-up; say instead which ranks
// collided and how to launch. Ranks compare the PCI address of the GPU they took on their host, not
// device numbers: a launcher that gives each rank its own CUDA_VISIBLE_DEVICES makes every rank take
// device 0, of distinct GPUs. Collective: every rank fails with the same message, or none does.
void refuse_shared_gpus(comm::MpiCollective& comm, int device) {
  char bus[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  const std::vector<std::string> gpus =
      comm.gather(std::string(bus) + " on " + std::string(host, static_cast<size_t>(host_length)));
  std::string clash;
  std::map<std::string, size_t> first_rank;  // "PCI address on host" -> the first rank that took it
  for (size_t r = 0; r < gpus.size() && clash.empty(); ++r) {
    if (const auto [it, fresh] = first_rank.emplace(gpus[r], r); !fresh) {
      clash = "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " both took GPU " + gpus[r];
    }
  }
  clash = comm.broadcast(clash);
  if (!clash.empty()) {
    fail(ErrorKind::kInvalidInput, "--device cuda: " + clash +
                                       ": start at most one rank per GPU (mpirun -n <GPUs> per node, or give each "
                                       "rank its own CUDA_VISIBLE_DEVICES)");
  }
}

}  // namespace

int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fail(ErrorKind::kInvalidInput,
         "--device cuda: no CUDA device is visible on this node (check the driver and CUDA_VISIBLE_DEVICES, or "
         "use --device cpu)");
  }
  return count;
}

DeviceContext::DeviceContext(comm::MpiCollective& comm, Collectives collectives) {
  const int device = comm.node_place().rank % visible_devices();
  CUDA_CHECK(cudaSetDevice(device));
  refuse_shared_gpus(comm, device);
  open(device);
  if (collectives == Collectives::kNone) return;
  ncclUniqueId id;
  if (comm.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  comm.broadcast_bytes(&id, sizeof(id));
  NCCL_CHECK(ncclCommInitRank(nccl_.out(), comm.size(), id, comm.rank()));
}

void DeviceContext::open(int device) {
  device_ = device;
  CUDA_CHECK(cudaSetDevice(device_));
  CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
  stream_ = std::make_unique<Stream>();
  CUBLAS_CHECK(cublasCreate(&cublas_));
  CUBLAS_CHECK(cublasSetStream(cublas_, stream_->get()));
  // True fp32 for fp32 training (no TF32), tensor cores for bf16/fp16 inputs.
  CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
}

DeviceContext::~DeviceContext() {
  if (cublas_) cublasDestroy(cublas_);
}

}  // namespace shardkit::trainer::cuda
