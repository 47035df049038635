// Scalar-generic dense products for the attention sub-layer (float for training, double for the
// finite-difference tests). Float contiguous linears go through kernels/cpu/matmul.h; strided
// products (the grouped output projection reads column blocks) and all double products call
// OpenBLAS directly. Row-major throughout; linear weights are [out, in].
#pragma once
#include <cstdint>

namespace trex::cpu {

// C[M,N] = alpha * op(A) * op(B) + beta * C with explicit leading dimensions (row-major).
template <typename T>
void gemm_ld(T* c, int64_t ldc, const T* a, int64_t lda, const T* b, int64_t ldb, int64_t m, int64_t n,
             int64_t k, bool trans_a, bool trans_b, T alpha, T beta);

// y[N,out] = x[N,in] * W[out,in]^T
template <typename T>
void linear_fwd_t(T* y, const T* x, const T* w, int64_t n, int64_t in, int64_t out);

// dx[N,in] += dy * W (skipped when dx is null); dW[out,in] += dy^T * x (skipped when dw is null)
template <typename T>
void linear_bwd_t(T* dx, T* dw, const T* dy, const T* x, const T* w, int64_t n, int64_t in, int64_t out);

}  // namespace trex::cpu
