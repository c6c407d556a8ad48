// make_cuda_backend and make_cuda_scorer in the shardkit command: the CUDA backend's module
// (cuda_module.hpp), loaded the first time either is called.
#include "trainer/cuda_module.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <string>

#include "base/error.hpp"

namespace shardkit::trainer {
namespace {

const CudaModule& cuda_module() {
  static const CudaModule* module = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::filesystem::path file = (ec ? std::filesystem::path() : self.parent_path()) / kCudaModuleFile;
    // Its references to the rest of shardkit resolve against this executable; RTLD_NOW reports a
    // missing one here, not in the middle of a run.
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      fail(ErrorKind::kInvalidInput,
           "--device cuda: cannot load the CUDA backend " + file.string() + " (" + dlerror() + ")");
    }
    using Entry = const CudaModule* (*)();
    const auto entry = reinterpret_cast<Entry>(dlsym(handle, kCudaModuleEntry));
    if (entry == nullptr) {
      fail(ErrorKind::kInvalidInput,
           "--device cuda: " + file.string() + " has no " + kCudaModuleEntry + ": not shardkit's CUDA backend");
    }
    module = entry();  // the module stays loaded for the life of the process
  });
  return *module;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return cuda_module().make_backend(options);
}

std::unique_ptr<WindowScorer> make_cuda_scorer(const model::Model& model, const InitFn& read, int batch, int seq_len,
                                               ckpt::DType dtype, comm::MpiCollective& comm) {
  return cuda_module().make_scorer(model, read, batch, seq_len, dtype, comm);
}

}  // namespace shardkit::trainer
