// The pieces of the GPU models every family shares.
#include "model/cuda/gpu_model.hpp"

#include "model/cuda/device_type.hpp"

namespace shardkit::model::cuda {

template <typename T, typename TC>
void gemm(cublasHandle_t handle, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const T* a, int lda,
          const T* b, int ldb, float beta, TC* c, int ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                            &alpha, b, DeviceType<T>::kCuda, ldb, a, DeviceType<T>::kCuda, lda, &beta, c,
                            DeviceType<TC>::kCuda, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <typename T>
void head_weight_grad(cublasHandle_t handle, float* dwte, const T* logits, int ld, const T* x, int V, int C, int rows,
                      GradWrite write) {
  const int aligned = V / 64 * 64;
  const float beta = grad_beta(write);
  if (aligned > 0) gemm<T, float>(handle, true, false, aligned, C, rows, 1.0f, logits, ld, x, C, beta, dwte, C);
  if (aligned < V) {
    gemm<T, float>(handle, true, false, V - aligned, C, rows, 1.0f, logits + aligned, ld, x, C, beta,
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

template void head_weight_grad<float>(cublasHandle_t, float*, const float*, int, const float*, int, int, int,
                                      GradWrite);
template void head_weight_grad<__nv_bfloat16>(cublasHandle_t, float*, const __nv_bfloat16*, int, const __nv_bfloat16*,
                                              int, int, int, GradWrite);
template void head_weight_grad<__half>(cublasHandle_t, float*, const __half*, int, const __half*, int, int, int,
                                       GradWrite);

}  // namespace shardkit::model::cuda
