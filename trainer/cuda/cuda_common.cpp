#include "trainer/cuda/cuda_common.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "base/clock.hpp"
#include "base/text_format.hpp"
#include "comm/watchdog.hpp"

namespace shardkit::trainer::cuda {

void throw_cuda(const char* what, const char* detail, const char* file, int line) {
  fail(ErrorKind::kInternal, std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + detail);
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

namespace {

std::mutex aborted_mutex;
std::set<ncclComm_t> aborted;  // communicators freed by ncclCommAbort

}  // namespace

void wait_checking_nccl(cudaStream_t stream, ncclComm_t comm) {
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    const double waited = seconds_since(start);
    if ((async != ncclSuccess && async != ncclInProgress) || waited > comm::collective_timeout_seconds()) {
      // Aborted here, before anything frees device memory: cudaFree would wait for the collectives
      // that never complete.
      const std::string detail = ncclGetLastError(comm) ? ncclGetLastError(comm) : "";
      // Said at once, and the error says it again once unwound: should the abort itself not return,
      // the log still shows why the job stopped.
      int rank = -1;
      ncclCommUserRank(comm, &rank);
      std::fprintf(stderr, "shardkit: rank %d: NCCL watchdog: %s; aborting the communicator\n", rank,
                   async != ncclSuccess && async != ncclInProgress ? ncclGetErrorString(async) : "no progress");
      std::fflush(stderr);
      ncclCommAbort(comm);
      {
        const std::lock_guard<std::mutex> lock(aborted_mutex);
        aborted.insert(comm);
      }
      fail(ErrorKind::kIo, async != ncclSuccess && async != ncclInProgress
                               ? std::string("NCCL failed during a collective: ") + ncclGetErrorString(async) +
                                     (detail.empty() ? "" : " (" + detail + ")")
                               : "no progress on the GPU for " + std::to_string(static_cast<int>(waited)) +
                                     " s (SHARDKIT_COLLECTIVE_TIMEOUT): a rank stalled or died inside a collective");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

bool nccl_aborted(ncclComm_t comm) {
  const std::lock_guard<std::mutex> lock(aborted_mutex);
  return aborted.count(comm) > 0;
}

}  // namespace shardkit::trainer::cuda
