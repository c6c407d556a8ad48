#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "model/cuda/device_type.hpp"
#include "model/cuda/kernels.hpp"
#include "model/cuda/matmul.hpp"

namespace shardkit::model::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// The largest power of two (at most 256) that divides the address: the alignment cuBLASLt may assume.
int alignment(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && x % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

template <typename V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const V& value) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

enum KeyField { kType, kEpilogue, kTransA, kTransB, kM, kN, kK, kLda, kLdb, kLdd, kAlignA, kAlignB, kAlignD, kWithC };

}  // namespace

struct Matmul::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fused = false;  // false: the epilogue runs as separate kernels after a plain product
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

Matmul::Matmul(cudaStream_t stream) : stream_(stream), workspace_(kWorkspaceBytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
}

Matmul::~Matmul() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

// Row-major d = op(a) op(b) is column-major d^T = op(b)^T op(a)^T: cuBLASLt's A is our b and its B
// our a; the bias runs along cuBLASLt's rows, our columns.
Matmul::Plan* Matmul::plan(const Key& key) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();
  const auto type = static_cast<cudaDataType_t>(std::get<kType>(key));
  const auto epilogue = static_cast<Epilogue>(std::get<kEpilogue>(key));
  const bool trans_a = std::get<kTransA>(key), trans_b = std::get<kTransB>(key);
  const int m = std::get<kM>(key), n = std::get<kN>(key), k = std::get<kK>(key);
  const int64_t ldd = std::get<kLdd>(key);

  auto make = [&](bool fused) {
    auto p = std::make_unique<Plan>();
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_attribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_attribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    cublasLtEpilogue_t lt = CUBLASLT_EPILOGUE_DEFAULT;
    if (fused) {
      lt = epilogue == Epilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
           : epilogue == Epilogue::kBiasGelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                             : CUBLASLT_EPILOGUE_DGELU;
      if (epilogue != Epilogue::kDGelu) set_attribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, type);
      if (epilogue != Epilogue::kBias) set_attribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldd);
    }
    set_attribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt);
    CUBLAS_CHECK(trans_b ? cublasLtMatrixLayoutCreate(&p->a, type, k, n, std::get<kLdb>(key))
                         : cublasLtMatrixLayoutCreate(&p->a, type, n, k, std::get<kLdb>(key)));
    CUBLAS_CHECK(trans_a ? cublasLtMatrixLayoutCreate(&p->b, type, m, k, std::get<kLda>(key))
                         : cublasLtMatrixLayoutCreate(&p->b, type, k, m, std::get<kLda>(key)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, type, n, m, ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t workspace = kWorkspaceBytes;
    const uint32_t align_a = static_cast<uint32_t>(std::get<kAlignB>(key));  // cuBLASLt's A is our b
    const uint32_t align_b = static_cast<uint32_t>(std::get<kAlignA>(key));
    const uint32_t align_d = static_cast<uint32_t>(std::get<kAlignD>(key));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle_, p->op, p->a, p->b, p->d, p->d, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS || count == 0) return std::unique_ptr<Plan>();
    p->algo = result.algo;
    p->fused = fused;
    return p;
  };
  std::unique_ptr<Plan> p = epilogue == Epilogue::kNone ? nullptr : make(true);
  if (!p) p = make(false);
  if (!p) {
    fail(ErrorKind::kInternal, "cuBLASLt has no algorithm for a " + std::to_string(m) + " x " + std::to_string(n) +
                                   " x " + std::to_string(k) + " matrix product");
  }
  return plans_.emplace(key, std::move(p)).first->second.get();
}

template <typename T>
void Matmul::run(Epilogue epilogue, bool trans_a, bool trans_b, int m, int n, int k, const T* a, int lda, const T* b,
                 int ldb, T* d, int ldd, const T* bias, T* pre, const T* residual) {
  if (residual && epilogue == Epilogue::kBiasGelu) fail(ErrorKind::kInternal, "GELU epilogue with a residual input");
  const Key key{static_cast<int>(DeviceType<T>::kCuda),
                static_cast<int>(epilogue),
                trans_a,
                trans_b,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                alignment(a),
                alignment(b),
                std::min({alignment(d), pre ? alignment(pre) : 256, residual ? alignment(residual) : 256}),
                residual != nullptr};
  Plan* p = plan(key);
  // Without a fused algorithm, kBiasGelu's product lands in `pre` and the GELU writes d from it.
  T* out = !p->fused && epilogue == Epilogue::kBiasGelu ? pre : d;
  if (p->fused && epilogue != Epilogue::kDGelu) set_attribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (p->fused && epilogue != Epilogue::kBias) set_attribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre);
  // The residual enters as cuBLASLt's C (beta = 1), read while d is written.
  const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p->op, &alpha, b, p->a, a, p->b, &beta, residual ? residual : out, p->d, out,
                              p->d, &p->algo, workspace_.data(), workspace_.bytes(), stream_));
  if (p->fused) return;
  const int64_t count = int64_t{m} * n;
  if (ldd != n && epilogue != Epilogue::kNone) {
    fail(ErrorKind::kInternal, "unfused matrix product epilogue needs contiguous rows");
  }
  switch (epilogue) {
    case Epilogue::kNone:
      break;
    case Epilogue::kBias:
      bias_forward(d, bias, m, n, stream_);
      break;
    case Epilogue::kBiasGelu:
      bias_forward(pre, bias, m, n, stream_);
      gelu_forward(d, pre, count, stream_);
      break;
    case Epilogue::kDGelu:
      gelu_backward(d, pre, d, count, stream_);
      break;
  }
}

#define SHARDKIT_INSTANTIATE(T)                                                                                      \
  template void Matmul::run<T>(Epilogue, bool, bool, int, int, int, const T*, int, const T*, int, T*, int, const T*, \
                               T*, const T*);
SHARDKIT_INSTANTIATE(float)
SHARDKIT_INSTANTIATE(__nv_bfloat16)
SHARDKIT_INSTANTIATE(__half)

}  // namespace shardkit::model::cuda
