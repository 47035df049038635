// Memory-bound fused kernels on bf16 activations with fp32 math (launchers; raw pointers, plain ints).
// Each mirrors a CPU kernel in src/kernels/cpu with the same semantics; tests/kernels/*_gpu.cpp checks
// every one against it.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/rope.h"

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// y = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps) per row (w may be null). rstd [n] is fp32.
void rmsnorm_fwd(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t n, int64_t d, float eps,
                 cudaStream_t s = nullptr);
// dx = d/dx (written); dw_partial [ceil(n/rows_per_block), d] fp32 partial sums reduced by
// rmsnorm_dw_reduce into dw (fp32, accumulated), deterministically (no atomics).
void rmsnorm_bwd(bf16* dx, float* dw_partial, const bf16* dy, const bf16* x, const bf16* w, const float* rstd,
                 int64_t n, int64_t d, cudaStream_t s = nullptr);
int64_t rmsnorm_dw_partial_rows(int64_t n);
void rmsnorm_dw_reduce(float* dw, const float* dw_partial, int64_t partial_rows, int64_t d, cudaStream_t s = nullptr);

// Per-head RMSNorm then partial RoPE in one pass (warp per row), the math of rmsnorm_fwd followed by rope_apply on
// its output (the normalised value is rounded to bf16 before the rotation, as there; only the sum of squares is
// reduced in another order). x, y [a.rows, a.heads, a.c] as rows * heads norm rows of width c; w [c] or null;
// rstd [rows * heads] fp32.
void rmsnorm_rope_fwd(bf16* y, float* rstd, const bf16* x, const bf16* w, float eps, const RopeArgs& a,
                      cudaStream_t s = nullptr);
// Backward of the weightless rmsnorm_rope_fwd: dx = rmsnorm_bwd(rope(dy)) where a is the transposed rotation
// (the forward's args with sign -1); dy is left unchanged (the rotated gradient is rounded to bf16 as an in-place
// rope_apply would). dx, dy, x [a.rows, a.heads, a.c]; rstd from the forward.
void rope_rmsnorm_bwd(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, const RopeArgs& a,
                      cudaStream_t s = nullptr);

// Clamped SwiGLU on a fused [n, 2f] gate|up buffer (gate in columns [0,f), up in [f,2f)): h [n, f].
void swiglu_fwd(bf16* h, const bf16* gate_up, int64_t n, int64_t f, float limit, cudaStream_t s = nullptr);
// d_gate_up [n, 2f] written.
void swiglu_bwd(bf16* d_gate_up, const bf16* dh, const bf16* gate_up, int64_t n, int64_t f, float limit,
                cudaStream_t s = nullptr);

}  // namespace trex::cuda
