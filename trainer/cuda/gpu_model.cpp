// The pieces of the GPU models every family shares, and the one place that maps a model to its
// family's CUDA model: a family with CUDA kernels adds its line to make_gpu_model.
#include "trainer/cuda/gpu_model.hpp"

#include "base/error.hpp"
#include "model/gpt2/cuda/gpu_model.hpp"
#include "model/gpt2/model.hpp"
#include "model/llama/cuda/gpu_model.hpp"
#include "model/llama/model.hpp"
#include "trainer/cuda/device_type.hpp"

namespace shardkit::trainer::cuda {

template <typename T, typename TC>
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const T* a, int lda,
          const T* b, int ldb, float beta, TC* c, int ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                            &alpha, b, DeviceType<T>::kCuda, ldb, a, DeviceType<T>::kCuda, lda, &beta, c,
                            DeviceType<TC>::kCuda, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <typename T>
void head_weight_grad(cublasHandle_t handle, float* dwte, const T* logits, int ld, const T* x, int V, int C, int rows) {
  const int aligned = V / 64 * 64;
  if (aligned > 0) gemm<T, float>(handle, true, false, aligned, C, rows, 1.0f, logits, ld, x, C, 1.0f, dwte, C);
  if (aligned < V) {
    gemm<T, float>(handle, true, false, V - aligned, C, rows, 1.0f, logits + aligned, ld, x, C, 1.0f,
                   dwte + static_cast<size_t>(aligned) * C, C);
  }
}

#define SHARDKIT_INSTANTIATE_GEMM(T, TC)                                                                           \
  template void gemm<T, TC>(cublasHandle_t, bool, bool, int, int, int, float, const T*, int, const T*, int, float, \
                            TC*, int);
SHARDKIT_INSTANTIATE_GEMM(float, float)
SHARDKIT_INSTANTIATE_GEMM(__nv_bfloat16, __nv_bfloat16)
SHARDKIT_INSTANTIATE_GEMM(__nv_bfloat16, float)
SHARDKIT_INSTANTIATE_GEMM(__half, __half)
SHARDKIT_INSTANTIATE_GEMM(__half, float)

template void head_weight_grad<float>(cublasHandle_t, float*, const float*, int, const float*, int, int, int);
template void head_weight_grad<__nv_bfloat16>(cublasHandle_t, float*, const __nv_bfloat16*, int, const __nv_bfloat16*,
                                              int, int, int);
template void head_weight_grad<__half>(cublasHandle_t, float*, const __half*, int, const __half*, int, int, int);

void require_gpu_kernels(const model::Model& m) {
  std::string why;
  if (const model::gpt2::GptConfig* gpt = model::gpt2::config_of(m)) {
    why = model::gpt2::cuda_unsupported(*gpt);
  } else if (const model::llama::LlamaConfig* llama = model::llama::config_of(m)) {
    why = model::llama::cuda_unsupported(*llama);
  } else {
    why = "the " + m.family() + " family has no CUDA kernels in this version";
  }
  if (!why.empty()) fail(ErrorKind::kInvalidInput, "model " + m.name() + ": " + why + " (--device cpu trains it)");
}

template <typename T>
std::unique_ptr<GpuModel<T>> make_gpu_model(const model::Model& m, const model::ActivationPlan& plan,
                                            cublasHandle_t cublas, cudaStream_t stream) {
  require_gpu_kernels(m);
  if (const model::gpt2::GptConfig* c = model::gpt2::config_of(m)) {
    return std::make_unique<model::gpt2::GpuGpt2<T>>(*c, plan, cublas, stream);
  }
  return std::make_unique<model::llama::GpuLlama<T>>(*model::llama::config_of(m), plan, cublas, stream);
}

template <typename T>
ActivationBytes planned_activation_bytes(const model::Model& m, const model::ActivationPlan& plan) {
  require_gpu_kernels(m);
  if (const model::gpt2::GptConfig* c = model::gpt2::config_of(m)) {
    return model::gpt2::GpuGpt2<T>::planned_activation_bytes(*c, plan);
  }
  return model::llama::GpuLlama<T>::planned_activation_bytes(*model::llama::config_of(m), plan);
}

#define SHARDKIT_INSTANTIATE_MODEL(T)                                                                        \
  template ActivationBytes planned_activation_bytes<T>(const model::Model&, const model::ActivationPlan&);   \
  template std::unique_ptr<GpuModel<T>> make_gpu_model<T>(const model::Model&, const model::ActivationPlan&, \
                                                          cublasHandle_t, cudaStream_t);
SHARDKIT_INSTANTIATE_MODEL(float)
SHARDKIT_INSTANTIATE_MODEL(__nv_bfloat16)
SHARDKIT_INSTANTIATE_MODEL(__half)
#undef SHARDKIT_INSTANTIATE_MODEL

}  // namespace shardkit::trainer::cuda
