#include "trainer/cuda/nccl.hpp"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "base/clock.hpp"
#include "comm/watchdog.hpp"

namespace shardkit::trainer::cuda {

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
