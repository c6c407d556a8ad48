// The CUDA backend's entry when it is loaded as a module (trainer/cuda_module.hpp).
#include "trainer/cuda_module.hpp"

extern "C" __attribute__((visibility("default"))) const shardkit::trainer::CudaModule* shardkit_cuda_module() {
  static const shardkit::trainer::CudaModule module{&shardkit::trainer::make_cuda_backend,
                                                    &shardkit::trainer::make_cuda_scorer};
  return &module;
}
