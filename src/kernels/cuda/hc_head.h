// The hc_head collapse of the final streams on the GPU (design §2.2 / §2.10), mirroring trex::dsv4::hc_head_fwd /
// hc_head_bwd for n_hc = 4: mix_i = (fn_i . x) * rstd(x) over the whole 4d token vector, w_i = sigmoid(scale *
// mix_i + base_i) + eps, y = sum_i w_i X[i]. bf16 streams, fp32 parameters and math.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// X [N, 4, d], fn [4, 4d], base [4], scale [1]. Writes mix, w [N, 4], rstd [N] and y [N, d] (y may be null:
// the training step collapses in fp32 with the final norm, mhc_norm.h).
void hc_head_fwd(bf16* y, float* mix, float* rstd, float* w, const bf16* X, const float* fn, const float* base,
                 const float* scale, int64_t N, int64_t d, float hc_eps, float rms_eps, cudaStream_t s = nullptr);

// fp32 scratch elements hc_head_bwd needs.
inline int64_t hc_head_bwd_scratch(int64_t N) { return 8 * N; }
// Where hc_head_bwd leaves dmix * rstd [N, 4] in its scratch: the factor of X in the fn gradient, for a caller
// that passes dfn = null and forms dfn [4, 4d] += dmix^T X as a tensor-core GEMM (split hi / lo).
inline const float* hc_head_bwd_dmix(int64_t N, const float* scratch) { return scratch + 4 * N; }
// dpre [N, 4] (nullable): dy . X[i], already formed by mhc_collapse_norm_bwd (saves a read of X).
// accumulate = false: dX is WRITTEN (no zero-filled buffer, no read of it); the parameter gradients still
// accumulate.
// dy [N, d] fp32 (mhc_collapse_norm_bwd's dc; see mhc_norm.h for why not bf16). ACCUMULATES dX [N, 4, d] and (nullable) dfn [4, 4d], dbase [4], dscale [1] (deterministic).
void hc_head_bwd(float* dX, float* dfn, float* dbase, float* dscale, const float* dy, const bf16* X,
                 const float* fn, const float* base, const float* scale, const float* mix, const float* rstd,
                 const float* w, int64_t N, int64_t d, float* scratch, cudaStream_t s = nullptr,
                 const float* dpre = nullptr, bool accumulate = true);

}  // namespace trex::cuda
