// Matrix products of the model's linear layers on cuBLASLt, with the bias, the GELU and GELU's
// gradient fused into the product's epilogue, so none of them costs another pass over the
// activations. Plans (descriptors and the chosen algorithm) are cached per shape. Where cuBLASLt has
// no fused algorithm for a case, the product runs plain and the kernels of kernels.hpp finish it.
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <tuple>

#include "model/cuda/cuda_common.hpp"

namespace shardkit::model::cuda {

enum class Epilogue {
  kNone,
  kBias,      // d = a b + bias
  kBiasGelu,  // pre = a b + bias; d = gelu(pre)   (tanh approximation, as GPT-2's gelu_new)
  kDGelu,     // d = (a b) * gelu'(pre)
};

class Matmul {
 public:
  explicit Matmul(cudaStream_t stream);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Row-major d (m x n) = op(a) (m x k) * op(b) (k x n) [+ residual], then the epilogue; bias has n
  // elements; pre and residual are m x n with row stride ldd (residual may not go with kBiasGelu).
  // T is float, __nv_bfloat16 or __half; fp32 accumulation (no TF32).
  template <typename T>
  void run(Epilogue epilogue, bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b, int ldb,
           T* d, int ldd, const T* bias = nullptr, T* pre = nullptr, const T* residual = nullptr);

 private:
  struct Plan;
  using Key = std::tuple<int, int, bool, bool, int, int, int, int, int, int, int, int, int, int>;
  Plan* plan(const Key& key);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<std::byte> workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace shardkit::model::cuda
