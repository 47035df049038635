// Manifold-constrained hyper-connections on the GPU (design §2.2), mirroring trex::dsv4::mhc_site_fwd / _bwd
// and mhc_expand_fwd / _bwd (src/model/dsv4/mhc.h) for n_hc = 4 streams: the 24 mixing values (fn . x) /
// RMS(x), pre / post gates, the exact Sinkhorn projection (row softmax, + eps, column normalisation, then
// (iters - 1) x (row, column), each x / (sum + eps)), the collapse and the expand. The backward recomputes
// the Sinkhorn iterations per token (one warp per token, a 4 x 4 matrix over 16 lanes) instead of storing
// them. Streams X are bf16 [N, 4, d]; every mixing quantity and every gradient is fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

constexpr int kMhcStreams = 4;
constexpr int kMhcMix = (2 + kMhcStreams) * kMhcStreams;  // 24: pre, post, comb (row-major 4 x 4)
constexpr int kMhcMaxSinkhornIters = 32;

struct MhcDims {
  int64_t n_tok = 0;
  int64_t d = 0;  // per-stream width, a multiple of 8
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float rms_eps = 1e-6f;
};

// Activations one site keeps for its backward (fp32 device pointers).
struct MhcActs {
  float* mix = nullptr;   // [N, 24]
  float* rstd = nullptr;  // [N]
  float* pre = nullptr;   // [N, 4]
  float* post = nullptr;  // [N, 4]
  float* comb = nullptr;  // [N, 4, 4], comb[i][j]: input stream i -> output stream j
};

// fn [24, 4d], base [24], scale [3] (fp32). Writes the acts and collapsed [N, d] = sum_i pre_i X[i] (bf16);
// collapsed may be null (the training step collapses in fp32 with its norm: mhc_norm.h).
void mhc_site_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, bf16* collapsed, cudaStream_t stream = nullptr);

// mhc_site_fwd fused with the RMSNorm that follows it, the collapse kept in fp32 (mhc_norm.h says why): writes
// the acts, normed [N, d] = norm_w * c * rstd (bf16) and norm_rstd [N]; the same numbers as mhc_site_fwd (no
// collapse) + mhc_collapse_norm_fwd, whose backward (mhc_collapse_norm_bwd) recomputes c bitwise. Serves
// d % 8 == 0, d <= 10264 (mhc_site_norm_fwd_serves).
bool mhc_site_norm_fwd_serves(int64_t d);
void mhc_site_norm_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                       const MhcActs& a, const bf16* norm_w, float norm_eps, bf16* normed, float* norm_rstd,
                       cudaStream_t stream = nullptr);

// The training form: the 24-wide projection comes from a tensor-core GEMM on a hi / lo bf16 split of fn,
// proj [N, 48] = X [N, 4d] . [fn_hi; fn_lo]^T (fp32 output; X is bf16, so hi + lo carries fn to ~2^-17 and every
// product is exact), and this kernel adds the halves, sums x^2 and does the rest of mhc_site_norm_fwd.
void mhc_site_norm_fwd_proj(const MhcDims& s, const bf16* X, const float* proj, const float* base,
                            const float* scale, const MhcActs& a, const bf16* norm_w, float norm_eps, bf16* normed,
                            float* norm_rstd, cudaStream_t stream = nullptr);
// hi = bf16(src), lo = bf16(src - hi) for src [rows, cols] fp32 (dense), written with row stride ld.
void mhc_split_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, bf16* hi, bf16* lo,
                    cudaStream_t stream = nullptr);
// dW [K, D] += S[0:K] + S[K:2K] (S [2K, D]: the product of a hi / lo split), in that order.
void mhc_add_split_rows(float* dW, const float* S, int64_t K, int64_t D, cudaStream_t stream = nullptr);


// Xout [N, 4, d] (bf16, written) = post_j y + sum_i comb[i][j] X[i]; y [N, d] bf16.
void mhc_expand_fwd(const MhcDims& s, const bf16* X, const bf16* y, const float* post, const float* comb,
                    bf16* Xout, cudaStream_t stream = nullptr);

// dXout [N, 4, d] fp32. ACCUMULATES dX [N, 4, d] and dy [N, d] (fp32); WRITES dpost [N, 4], dcomb [N, 16].
// accumulate = false: WRITES dX and dy instead (no zero-filled buffers, no read of them); then dy_bf16, when
// given, receives dy rounded to bf16 and dy is not touched (may be null).
void mhc_expand_bwd(const MhcDims& s, const bf16* X, const bf16* y, const float* post, const float* comb,
                    const float* dXout, float* dX, float* dy, float* dpost, float* dcomb,
                    cudaStream_t stream = nullptr, bool accumulate = true, bf16* dy_bf16 = nullptr);

// fp32 elements of scratch mhc_site_bwd needs.
int64_t mhc_site_bwd_scratch(const MhcDims& s);
// Where mhc_site_bwd leaves dmix * rstd [N, 24] in its scratch: the factor of X in the fn gradient, for a caller
// that passes dfn = null and forms dfn [24, 4d] += dmix^T X as a tensor-core GEMM (split hi / lo).
const float* mhc_site_bwd_dmix(const MhcDims& s, const float* scratch);
// dcollapsed [N, d] fp32 (mhc_collapse_norm_bwd's dc: a bf16 copy would swamp the cancelling gate gradients
// dpre_i = dc . X[i], see mhc_norm.h), dpost / dcomb from mhc_expand_bwd. ACCUMULATES dX [N, 4, d], dfn [24, 4d], dbase
// [24], dscale [3] (fp32; dfn, dbase, dscale may be null). Deterministic: no atomics. dpre [N, 4] (nullable):
// the gate gradients dcollapsed . X[i] already formed by mhc_collapse_norm_bwd (saves a read of X).
void mhc_site_bwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, const float* dcollapsed, const float* dpost, const float* dcomb, float* dX,
                  float* dfn, float* dbase, float* dscale, float* scratch, cudaStream_t stream = nullptr,
                  const float* dpre = nullptr);

}  // namespace trex::cuda
