// Grouped GEMMs of the routed experts (design §2.9): one launch covers every expert, with the rows of expert e
// being offsets[e] .. offsets[e+1] of the expert-grouped activations. The offsets stay in DEVICE memory (they come
// from moe_route_plan): tiles are laid over (expert, m-tile, n-tile) from a device-side prefix of the per-expert
// tile counts, the grid is an upper bound and surplus blocks exit, so the host never learns the counts. bf16
// operands (16-byte aligned), fp32 accumulation on tensor cores. Row-major, and named like the dense Linear of
// the GPU model: W_e is [out, in] at W + e * out * in. On Hopper (sm_90a) a wgmma + TMA kernel
// (grouped_gemm_sm90.cuh) runs; elsewhere, and for extents past its int32 coordinates, mma.sync kernels
// (grouped_gemm_mma.cuh). grouped_gemm_dispatch.h says which call takes which.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// int32 scratch elements the row-grouped products (fwd, dx) need for n_groups experts.
int64_t grouped_linear_scratch(int64_t n_groups);

// y[r, out] (bf16, written) = x[r, in] W_e[out, in]^T for every row r of expert e. rows = offsets[n_groups] is
// the total (a host bound: the buffers hold that many rows). in, out multiples of 8.
void grouped_linear_fwd(bf16* y, const bf16* x, const bf16* W, const int32_t* offsets, int64_t n_groups,
                        int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream = nullptr);
// dx[r, in] (bf16, written) = dy[r, out] W_e[out, in].
void grouped_linear_dx(bf16* dx, const bf16* dy, const bf16* W, const int32_t* offsets, int64_t n_groups,
                       int64_t rows, int64_t in, int64_t out, int32_t* scratch, cudaStream_t stream = nullptr);
// dW_e[out, in] (fp32, accumulated) += dy_e[rows_e, out]^T x_e[rows_e, in]; experts without rows are untouched.
// With `rows` (= offsets[n_groups], the host bound of dy / x, as for fwd / dx) the sm90 kernel can take it (its
// tensor maps need the extent); without, the mma.sync kernels run.
void grouped_linear_dw(float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t n_groups,
                       int64_t rows, int64_t in, int64_t out, cudaStream_t stream = nullptr);
void grouped_linear_dw(float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t n_groups,
                       int64_t in, int64_t out, cudaStream_t stream = nullptr);

}  // namespace trex::cuda
