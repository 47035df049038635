// Dense fp32 matrix products on the CPU (OpenBLAS), in the shapes the model uses.
// Row-major throughout. Linear layers store W as [out, in] (PyTorch/safetensors convention).
#pragma once
#include <cstdint>

namespace trex::cpu {

// C[M,N] (= or +=) A[M,K] * op(B), with op(B) = B[K,N] (trans_b false) or B[N,K]^T (trans_b true).
void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
          float alpha = 1.0f, float beta = 0.0f);

// y[N,out] = x[N,in] * W[out,in]^T
void linear_fwd(float* y, const float* x, const float* w, int64_t n, int64_t in, int64_t out);
// dx[N,in] += dy[N,out] * W[out,in]   (skipped when dx is null)
// dW[out,in] += dy^T * x              (skipped when dw is null)
void linear_bwd(float* dx, float* dw, const float* dy, const float* x, const float* w, int64_t n, int64_t in,
                int64_t out);

}  // namespace trex::cpu
