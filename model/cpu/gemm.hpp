// Single-precision matrix products for the CPU models: row-major C = alpha * op(A) * op(B) + beta * C.
// Backed by the system's CBLAS (OpenBLAS) when the build found one, else by a cache-blocked,
// OpenMP-parallel fallback.
#pragma once

namespace shardkit::model::cpu {

// op(A) is M x K (A is K x M when trans_a), op(B) is K x N (B is N x K when trans_b); lda, ldb, ldc
// are row strides in elements.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc);

// The same product on the calling thread alone, for callers that already run on every OpenMP thread
// (the attention, one head per thread). The same arguments give the same bits on every call.
void sgemm_serial(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc);

// Sets the number of threads matrix products (and the model's OpenMP loops) use.
void set_compute_threads(int threads);
// What the build uses for matrix products ("OpenBLAS 0.3.21", "built-in").
const char* gemm_backend();

}  // namespace shardkit::model::cpu
