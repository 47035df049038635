// Grouped GEMMs of the routed experts (design §2.9): one launch covers every expert, with the rows of expert e
// being offsets[e] .. offsets[e+1] of the expert-grouped activations. The offsets stay in DEVICE memory (they come
// from moe_route_plan): tiles are laid over (expert, m-tile, n-tile) from a device-side prefix of the per-expert
// tile counts, the grid is an upper bound and surplus blocks exit, so the host never learns the counts. bf16
// operands, fp32 accumulation on tensor cores (mma.sync m16n8k16, cp.async multi-stage pipeline). Row-major, and
// named like the dense Linear of the GPU model: W_e is [out, in] at W + e * out * in. On Hopper (sm_90a) a
// wgmma + TMA kernel (grouped_gemm_sm90.cuh) serves the same calls; the mma.sync kernels stay as the fallback.
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

// Benchmark knob: 0 chooses the kernel and tile configuration (the default), 1 forces 128 x 128 x 32 tiles,
// 2 forces 128 x 256 x 32, 3 forces 128 x 256 x 64, 4 and 5 force 128 x 256 x 32 / x 64 with 4 pipeline stages,
// 6 forces 256 x 128 x 64 (mma.sync kernels); 7, 8, 9 force the Hopper kernel (grouped_gemm_sm90.cuh: wgmma + TMA,
// persistent, warp-specialised) with 128 x 256 tiles / 4 stages, 128 x 256 / 3 stages, 128 x 128 / 6 stages
// (the old dw overload without `rows` runs 128 x 256 x 64 for these); 10 / 11 the 128 x 256 Hopper kernel in
// clusters of two CTAs along N / M (TMA multicast of the shared operand), 12 / 13 = 7 / 9 with the epilogue
// staged through shared memory, 14 = 12 with dw added by L2 reductions. Auto takes 14 on Hopper.
// Process-wide; tests and benchmarks only.
void grouped_gemm_set_variant(int v);
// Whether variants 7-14 (the sm90 kernel) can run on the current device.
bool grouped_gemm_sm90_available();

}  // namespace trex::cuda
