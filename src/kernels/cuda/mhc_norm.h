// The collapse of n_hc bf16 streams followed by RMSNorm, kept in fp32 between the two (design §2.2): the
// collapse c = sum_i p_i X[i] (p = the mHC site's `pre` gates, or hc_head's `w`) is never rounded to bf16.
// Why: the norm's input gradient dc is orthogonal to c, and the gate gradients dp_i = dc . X[i] cancel across
// nearly equal streams (exactly in layer 0, whose streams are copies). A bf16 copy of c (or of dc) leaves a
// residue of ~2^-9 |dc| |X| per token that swamps those small sums, so the mHC / hc_head parameter gradients
// drifted several times their size from the CPU fp32 model. Here the forward normalises the fp32 collapse and
// the backward recomputes it bitwise (same operation order) and returns dc in fp32, exactly orthogonal in fp32.
// Any n_hc in 1..4; d any width (8-wide vector accesses when d % 8 == 0).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// X [N, n_hc, d] bf16, p [N, n_hc] fp32, w [d] bf16 (the norm weight). Writes normed [N, d] bf16 =
// w * c * rstd and rstd [N] = 1 / sqrt(mean(c^2) + eps).
void mhc_collapse_norm_fwd(int64_t n_hc, const bf16* X, const float* p, const bf16* w, int64_t N, int64_t d,
                           float eps, bf16* normed, float* rstd, cudaStream_t stream = nullptr);

// Rows of dw partial sums mhc_collapse_norm_bwd writes ([rows, d] fp32).
int64_t mhc_collapse_norm_dw_rows(int64_t N);
// dy [N, d] fp32 (gradient of normed). WRITES dc [N, d] fp32 (gradient of the fp32 collapse) and, when
// dw_partial is given, dw_partial [mhc_collapse_norm_dw_rows(N), d]; then ACCUMULATES dw [d] += the sum of
// those rows in fixed order (deterministic). dw and dw_partial may be null together. dp (nullable): WRITES
// dp [N, n_hc] = dc . X[i] in fp32, the gate gradients mhc_site_bwd / hc_head_bwd would otherwise compute with
// one more read of the streams (pass it to them as dpre).
void mhc_collapse_norm_bwd(int64_t n_hc, const bf16* X, const float* p, const bf16* w, const float* rstd,
                           const float* dy, int64_t N, int64_t d, float* dc, float* dw, float* dw_partial,
                           float* dp, cudaStream_t stream = nullptr);

}  // namespace trex::cuda
