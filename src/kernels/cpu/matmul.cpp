#include "kernels/cpu/matmul.h"

#include <cblas.h>

namespace trex::cpu {

void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
          float alpha, float beta) {
  if (m == 0 || n == 0) return;
  const blasint lda = blasint(trans_a ? m : k);
  const blasint ldb = blasint(trans_b ? k : n);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), alpha, a, lda, b, ldb, beta, c, blasint(n));
}

void linear_fwd(float* y, const float* x, const float* w, int64_t n, int64_t in, int64_t out) {
  gemm(y, x, w, n, out, in, false, true);
}

void linear_bwd(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t n, int64_t in,
                int64_t out) {
  if (dx) gemm(dx, dy, w, n, in, out, false, false, 1.0f, 1.0f);
  if (dw) gemm(dw, dy, x, out, in, n, true, false, 1.0f, 1.0f);
}

}  // namespace trex::cpu
