// The CUDA backend as a module: the shardkit command does not link it but loads libshardkit_cuda.so,
// found beside its executable, when a command first asks for a GPU (cuda_module.cpp). Loading cuBLAS
// runs its initialisers, about half a second, which every command that never uses a GPU -- most of
// them, and every process the tests start -- would pay at start-up if the command linked it. Tests
// and benchmarks link the backend itself (shardkit_cuda).
#pragma once

#include <memory>

#include "trainer/backend.hpp"
#include "trainer/eval.hpp"

namespace shardkit::trainer {

// What the module hands the command: its make_cuda_backend and make_cuda_scorer.
struct CudaModule {
  std::unique_ptr<Backend> (*make_backend)(const BackendOptions& options);
  std::unique_ptr<WindowScorer> (*make_scorer)(const model::Model& model, const InitFn& read, int batch, int seq_len,
                                               ckpt::DType dtype, comm::MpiCollective& comm);
};

inline constexpr char kCudaModuleFile[] = "libshardkit_cuda.so";
// The module's one exported function, extern "C": returns its CudaModule.
inline constexpr char kCudaModuleEntry[] = "shardkit_cuda_module";

}  // namespace shardkit::trainer
