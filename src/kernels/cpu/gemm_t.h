// Row-major GEMM for float and double (OpenBLAS), so the model's blocks can be templated on the scalar type and
// checked by finite differences in double. Semantics as trex::cpu::gemm in matmul.h.
#pragma once
#include <cblas.h>

#include <cstdint>

namespace trex::cpu {

// C[M,N] = alpha * op(A) * op(B) + beta * C; op(A) is A[M,K] or A[K,M]^T, op(B) is B[K,N] or B[N,K]^T.
inline void gemm_t(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
                   bool trans_b, float alpha = 1.0f, float beta = 0.0f) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blasint(m),
              blasint(n), blasint(k), alpha, a, blasint(trans_a ? m : k), b, blasint(trans_b ? k : n), beta, c,
              blasint(n));
}
inline void gemm_t(double* c, const double* a, const double* b, int64_t m, int64_t n, int64_t k, bool trans_a,
                   bool trans_b, double alpha = 1.0, double beta = 0.0) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == 0.0 ? 0.0 : beta * c[i];
    return;
  }
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, blasint(m),
              blasint(n), blasint(k), alpha, a, blasint(trans_a ? m : k), b, blasint(trans_b ? k : n), beta, c,
              blasint(n));
}

// y[N,out] = x[N,in] * W[out,in]^T
template <class T>
inline void linear_fwd_t(T* y, const T* x, const T* w, int64_t n, int64_t in, int64_t out) {
  gemm_t(y, x, w, n, out, in, false, true);
}
// dx[N,in] += dy * W (when dx), dW[out,in] += dy^T * x (when dw)
template <class T>
inline void linear_bwd_t(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t n, int64_t in, int64_t out) {
  if (dx) gemm_t(dx, dy, w, n, in, out, false, false, T(1), T(1));
  if (dw) gemm_t(dw, dy, x, out, in, n, true, false, T(1), T(1));
}

}  // namespace trex::cpu
