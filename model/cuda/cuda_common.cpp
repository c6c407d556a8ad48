#include "model/cuda/cuda_common.hpp"

#include <unistd.h>

#include <string>

#include "base/text_format.hpp"

namespace shardkit::model::cuda {

void throw_cuda(const char* what, const char* detail, const char* file, int line) {
  fail(ErrorKind::kInternal, std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + detail);
}

int multiprocessors() {
  int device = 0, count = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

void throw_allocation_failure(cudaError_t status, size_t bytes, Memory where) {
  const bool device = where == Memory::kDevice;
  if (status != cudaErrorMemoryAllocation) {
    throw_cuda(device ? "cudaMalloc" : "cudaMallocHost", cudaGetErrorString(status), __FILE__, __LINE__);
  }
  cudaGetLastError();  // out of memory is not sticky: clear it, the device stays usable
  const std::string asked = format_bytes(static_cast<double>(bytes));
  if (!device) {
    const double available =
        static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    fail(ErrorKind::kIo, "out of page-locked host memory: " + asked + " more asked, " + format_bytes(available) +
                             " of the host's memory free (offloaded optimizer states, offloaded parameters and "
                             "checkpoint snapshots are page-locked; check also `ulimit -l`)");
  }
  int ordinal = 0;
  size_t free = 0, total = 0;
  cudaDeviceProp props{};
  if (cudaGetDevice(&ordinal) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess ||
      cudaGetDeviceProperties(&props, ordinal) != cudaSuccess) {
    fail(ErrorKind::kIo, "out of GPU memory: " + asked + " more asked");
  }
  fail(ErrorKind::kIo, "out of GPU memory: " + asked + " more asked of CUDA device " + std::to_string(ordinal) + " (" +
                           props.name + "), which has " + format_bytes(static_cast<double>(free)) + " free of " +
                           format_bytes(static_cast<double>(total)) +
                           "; lower train_micro_batch_size_per_gpu, raise zero_optimization.stage, or offload "
                           "(offload_optimizer, and offload_param at stage 3)");
}

}  // namespace shardkit::model::cuda
