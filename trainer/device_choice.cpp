#include "trainer/device_choice.hpp"

#include <dlfcn.h>

#include "base/error.hpp"

#ifndef SHARDKIT_BUILT_WITH_CUDA
#error "trainer/CMakeLists.txt defines SHARDKIT_BUILT_WITH_CUDA for this file"
#endif

namespace shardkit::trainer {
namespace {

// The two driver API calls the probe needs (cuda.h's signatures; CUresult is an int).
using CuInit = int (*)(unsigned int flags);
using CuDeviceGetCount = int (*)(int* count);
constexpr int kCudaErrorNoDevice = 100;

std::string plural_gpus(int n) {
  return std::to_string(n) + (n == 1 ? " GPU" : " GPUs");
}

}  // namespace

GpuProbe probe_gpus() {
  GpuProbe probe;
  probe.built_with_cuda = SHARDKIT_BUILT_WITH_CUDA != 0;
  if (!probe.built_with_cuda) return probe;
  // Left loaded: the CUDA backend, if chosen, uses the same driver, and unloading it after cuInit is
  // not supported.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    probe.driver_problem = "no CUDA driver (libcuda.so.1 not found)";
    return probe;
  }
  const auto init = reinterpret_cast<CuInit>(dlsym(driver, "cuInit"));
  const auto count = reinterpret_cast<CuDeviceGetCount>(dlsym(driver, "cuDeviceGetCount"));
  if (init == nullptr || count == nullptr) {
    probe.driver_problem = "libcuda.so.1 lacks cuInit or cuDeviceGetCount";
    return probe;
  }
  const int status = init(0);
  if (status == kCudaErrorNoDevice) return probe;
  if (status != 0) {
    probe.driver_problem = "cuInit failed with CUDA error " + std::to_string(status);
    return probe;
  }
  if (count(&probe.visible_gpus) != 0) probe.visible_gpus = 0;
  return probe;
}

DeviceChoice choose_device(std::string_view requested, const GpuProbe& probe, int local_rank) {
  if (requested == "cpu" || requested == "cuda") return {requested == "cuda", "--device " + std::string(requested)};
  if (requested != "auto") {
    fail(ErrorKind::kInvalidInput, "--device is '" + std::string(requested) + "', must be auto, cpu or cuda");
  }
  if (!probe.built_with_cuda) return {false, "auto: this shardkit was built without CUDA"};
  if (probe.visible_gpus == 0) {
    return {false, "auto: no GPU visible" + (probe.driver_problem.empty() ? "" : " (" + probe.driver_problem + ")")};
  }
  if (local_rank >= probe.visible_gpus) {
    return {false, "auto: " + plural_gpus(probe.visible_gpus) + " visible, fewer than the ranks of a node"};
  }
  return {true, "auto: " + plural_gpus(probe.visible_gpus) + " visible"};
}

DeviceChoice choose_device(std::string_view requested, comm::MpiCollective& comm) {
  DeviceChoice mine = choose_device(requested, probe_gpus(), comm.node_place().rank);
  if (requested != "auto") return mine;
  // A rank without a GPU tells its own reason; one with a GPU, how many ranks have none.
  const double without_gpu = comm.allreduce_sum(mine.cuda ? 0.0 : 1.0);
  if (without_gpu == 0 || !mine.cuda) return mine;
  return {false, "auto: " + std::to_string(static_cast<int>(without_gpu)) + " of " + std::to_string(comm.size()) +
                     " ranks have no GPU of their own"};
}

}  // namespace shardkit::trainer
