#include "kernels/cpu/attention_blas.h"

#include <cblas.h>

#include "kernels/cpu/matmul.h"

namespace trex::cpu {

template <>
void gemm_ld<float>(float* c, int64_t ldc, const float* a, int64_t lda, const float* b, int64_t ldb,
                    int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), alpha, a, blasint(lda), b, blasint(ldb), beta, c,
              blasint(ldc));
}

template <>
void gemm_ld<double>(double* c, int64_t ldc, const double* a, int64_t lda, const double* b, int64_t ldb,
                     int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, double alpha, double beta) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), alpha, a, blasint(lda), b, blasint(ldb), beta, c,
              blasint(ldc));
}

template <>
void linear_fwd_t<float>(float* y, const float* x, const float* w, int64_t n, int64_t in, int64_t out) {
  linear_fwd(y, x, w, n, in, out);
}

template <>
void linear_fwd_t<double>(double* y, const double* x, const double* w, int64_t n, int64_t in, int64_t out) {
  gemm_ld<double>(y, out, x, in, w, in, n, out, in, false, true, 1.0, 0.0);
}

template <>
void linear_bwd_t<float>(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t n,
                         int64_t in, int64_t out) {
  linear_bwd(dx, dw, dy, x, w, n, in, out);
}

template <>
void linear_bwd_t<double>(double* dx, double* dw, const double* dy, const double* x, const double* w,
                          int64_t n, int64_t in, int64_t out) {
  if (dx) gemm_ld<double>(dx, in, dy, out, w, in, n, in, out, false, false, 1.0, 1.0);
  if (dw) gemm_ld<double>(dw, in, dy, out, x, in, out, in, n, true, false, 1.0, 1.0);
}

}  // namespace trex::cpu
