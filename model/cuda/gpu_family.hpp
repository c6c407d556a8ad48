// The CUDA half of the family registry: what a family with CUDA kernels registers (a GpuFamily, made by
// describe_gpu_family in its model/<family>/cuda/), the list of them, and the backend's three questions
// of a model -- can it run, make it, how much activation memory will it take.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "model/cuda/gpu_model.hpp"
#include "model/model.hpp"

namespace shardkit::model::cuda {

// A family's CUDA models for one compute type T.
template <typename T>
struct GpuFactory {
  std::function<std::unique_ptr<GpuModel<T>>(const Model&, const ActivationPlan&, cublasHandle_t, cudaStream_t)> make;
  std::function<ActivationBytes(const Model&, const ActivationPlan&)> planned_activation_bytes;
};

struct GpuFamily {
  // Whether `m` is a model of this family.
  std::function<bool(const Model&)> owns;
  // Why the family's kernels cannot compute `m`, a model it owns ("" when they can).
  std::function<std::string(const Model&)> unsupported;
  GpuFactory<float> f32;
  GpuFactory<__nv_bfloat16> bf16;
  GpuFactory<__half> f16;

  template <typename T>
  const GpuFactory<T>& factory() const noexcept {
    if constexpr (std::is_same_v<T, float>) {
      return f32;
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return bf16;
    } else {
      static_assert(std::is_same_v<T, __half>);
      return f16;
    }
  }
};

// A family's registration from its configuration's accessor (null for a model of another family), the
// reason its kernels refuse a configuration ("" when they do not), and its model class template:
// Impl<T>(const Config&, const ActivationPlan&, cublasHandle_t, cudaStream_t), and
// Impl<T>::planned_activation_bytes(const Config&, const ActivationPlan&).
template <template <typename> class Impl, typename Config>
GpuFamily describe_gpu_family(const Config* (*config_of)(const Model&), std::string (*unsupported)(const Config&)) {
  const auto factory = [config_of]<typename T>(std::type_identity<T>) {
    return GpuFactory<T>{
        [config_of](const Model& m, const ActivationPlan& plan, cublasHandle_t cublas, cudaStream_t stream) {
          return std::unique_ptr<GpuModel<T>>(std::make_unique<Impl<T>>(*config_of(m), plan, cublas, stream));
        },
        [config_of](const Model& m, const ActivationPlan& plan) {
          return Impl<T>::planned_activation_bytes(*config_of(m), plan);
        }};
  };
  return GpuFamily{[config_of](const Model& m) { return config_of(m) != nullptr; },
                   [config_of, unsupported](const Model& m) { return unsupported(*config_of(m)); },
                   factory(std::type_identity<float>{}), factory(std::type_identity<__nv_bfloat16>{}),
                   factory(std::type_identity<__half>{})};
}

// Every family with CUDA kernels (gpu_family.cpp: one line a family).
const std::vector<const GpuFamily*>& gpu_families();

// The registration of `model`'s family. Error(kInvalidInput) naming the model when its family has no
// CUDA kernels or its shape is one they do not support. Needs no device: the backend asks before it
// opens one.
const GpuFamily& require_gpu_kernels(const Model& model);

// The CUDA model of `model`'s family.
template <typename T>
std::unique_ptr<GpuModel<T>> make_gpu_model(const Model& model, const ActivationPlan& plan, cublasHandle_t cublas,
                                            cudaStream_t stream) {
  return require_gpu_kernels(model).factory<T>().make(model, plan, cublas, stream);
}

// What that model's activations will take, before any allocation: on the device its
// activation_bytes(), and the block inputs it keeps in host memory.
template <typename T>
ActivationBytes planned_activation_bytes(const Model& model, const ActivationPlan& plan) {
  return require_gpu_kernels(model).factory<T>().planned_activation_bytes(model, plan);
}

}  // namespace shardkit::model::cuda
