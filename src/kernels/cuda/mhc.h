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

// fn [24, 4d], base [24], scale [3] (fp32). Writes the acts and collapsed [N, d] = sum_i pre_i X[i] (bf16).
void mhc_site_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, bf16* collapsed, cudaStream_t stream = nullptr);

// Xout [N, 4, d] (bf16, written) = post_j y + sum_i comb[i][j] X[i]; y [N, d] bf16.
void mhc_expand_fwd(const MhcDims& s, const bf16* X, const bf16* y, const float* post, const float* comb,
                    bf16* Xout, cudaStream_t stream = nullptr);

// dXout [N, 4, d] fp32. ACCUMULATES dX [N, 4, d] and dy [N, d] (fp32); WRITES dpost [N, 4], dcomb [N, 16].
void mhc_expand_bwd(const MhcDims& s, const bf16* X, const bf16* y, const float* post, const float* comb,
                    const float* dXout, float* dX, float* dy, float* dpost, float* dcomb,
                    cudaStream_t stream = nullptr);

// fp32 elements of scratch mhc_site_bwd needs.
int64_t mhc_site_bwd_scratch(const MhcDims& s);
// dcollapsed [N, d] bf16, dpost / dcomb from mhc_expand_bwd. ACCUMULATES dX [N, 4, d], dfn [24, 4d], dbase
// [24], dscale [3] (fp32; dfn, dbase, dscale may be null). Deterministic: no atomics.
void mhc_site_bwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, const bf16* dcollapsed, const float* dpost, const float* dcomb, float* dX,
                  float* dfn, float* dbase, float* dscale, float* scratch, cudaStream_t stream = nullptr);

}  // namespace trex::cuda
