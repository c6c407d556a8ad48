#include "model/cuda/gpu_family.hpp"

#include "base/error.hpp"
#include "model/gpt2/cuda/gpu_model.hpp"
#include "model/llama/cuda/gpu_model.hpp"

namespace shardkit::model::cuda {

const std::vector<const GpuFamily*>& gpu_families() {
  static const std::vector<const GpuFamily*> list{
      &gpt2::gpu_family(),
      &llama::gpu_family(),
  };
  return list;
}

const GpuFamily& require_gpu_kernels(const Model& m) {
  for (const GpuFamily* family : gpu_families()) {
    if (!family->owns(m)) continue;
    const std::string why = family->unsupported(m);
    if (!why.empty()) fail(ErrorKind::kInvalidInput, "model " + m.name() + ": " + why + " (--device cpu trains it)");
    return *family;
  }
  fail(ErrorKind::kInvalidInput, "model " + m.name() + ": the " + m.family() +
                                     " family has no CUDA kernels in this version (--device cpu trains it)");
}

}  // namespace shardkit::model::cuda
