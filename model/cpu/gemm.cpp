#include "model/cpu/gemm.hpp"

#include <omp.h>

#include <algorithm>

#if SHARDKIT_HAVE_CBLAS
#include <cblas.h>
#endif

namespace shardkit::model::cpu {

#if SHARDKIT_HAVE_CBLAS

// One thread pool for everything: OpenBLAS runs single-threaded inside the model's OpenMP threads,
// each thread computing a block of rows of C. (OpenBLAS's own threads and spinning OpenMP workers
// would fight over the cores: measured 8x slower on 2 cores.)
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  const int threads = std::min(omp_get_max_threads(), std::max(1, m / 16));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int rows = (m + threads - 1) / threads;
    const int i0 = std::min(m, t * rows);
    const int i1 = std::min(m, i0 + rows);
    if (i1 > i0) {
      // Row i of op(A) is row i of A, or column i of A when transposed.
      const float* a_rows = trans_a ? a + i0 : a + static_cast<size_t>(i0) * lda;
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, i1 - i0, n,
                  k, alpha, a_rows, lda, b, ldb, beta, c + static_cast<size_t>(i0) * ldc, ldc);
    }
  }
}

void sgemm_serial(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

void set_compute_threads(int threads) {
  openblas_set_num_threads(1);
  omp_set_num_threads(threads);
}

const char* gemm_backend() {
  return "OpenBLAS (one thread per OpenMP worker)";
}

#else

// Fallback: rows of C are split across threads; each row accumulates alpha * a(i, p) * b(p, :) over p,
// which streams B row by row (contiguous when B is not transposed). Correct and portable, several times
// slower than an optimised BLAS.
namespace {
void sgemm_row(bool trans_a, bool trans_b, int i, int n, int k, float alpha, const float* a, int lda, const float* b,
               int ldb, float beta, float* c, int ldc) {
  float* ci = c + static_cast<size_t>(i) * ldc;
  for (int j = 0; j < n; ++j) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
  for (int p = 0; p < k; ++p) {
    const float aip = alpha * (trans_a ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p]);
    if (trans_b) {
      for (int j = 0; j < n; ++j) ci[j] += aip * b[static_cast<size_t>(j) * ldb + p];
    } else {
      const float* bp = b + static_cast<size_t>(p) * ldb;
      for (int j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}
}  // namespace

void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < m; ++i) sgemm_row(trans_a, trans_b, i, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm_serial(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i) sgemm_row(trans_a, trans_b, i, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_compute_threads(int threads) {
  omp_set_num_threads(threads);
}

const char* gemm_backend() {
  return "built-in";
}

#endif

}  // namespace shardkit::model::cpu
