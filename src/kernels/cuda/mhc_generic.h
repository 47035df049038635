// Generic mHC and hc_head on the GPU for any stream count n_hc <= kMhcGenericMaxStreams: the fallback for
// hc_mult != 4, which the fast kernels (mhc.h, hc_head.h: n_hc = 4 only) do not serve, e.g. the parity
// fixtures v4-tiny-b (3 streams) and v4-tiny-c (2). Same contracts and buffers as those kernels (mirroring
// src/model/dsv4/mhc.cpp), with n_hc strides: mix [N, (2 + n) n], pre / post [N, n], comb [N, n, n]. One
// thread per token does a token's work serially in fp32 (the Sinkhorn backward recomputes the forward
// iterations in local memory); parameter gradients are summed over tokens in token order by separate kernels
// (deterministic, no atomics). Speed is not a goal (fixture-sized models only). As there, collapsed / y may be
// null (the training step collapses in fp32, mhc_norm.h) and the collapse gradients are fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/hc_head.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/mhc_norm.h"

namespace trex::cuda {

constexpr int kMhcGenericMaxStreams = 4;

// Streams the fast kernels serve; everything else goes to the generic ones.
inline bool mhc_fast_streams(int64_t n_hc) {
  return n_hc == kMhcStreams;
}

void mhc_site_fwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const float* fn, const float* base,
                          const float* scale, const MhcActs& a, bf16* collapsed,
                          cudaStream_t stream = nullptr);
void mhc_expand_fwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const bf16* y, const float* post,
                            const float* comb, bf16* Xout, cudaStream_t stream = nullptr);
void mhc_expand_bwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const bf16* y, const float* post,
                            const float* comb, const float* dXout, float* dX, float* dy, float* dpost,
                            float* dcomb, cudaStream_t stream = nullptr, bool accumulate = true,
                            bf16* dy_bf16 = nullptr);
int64_t mhc_site_bwd_generic_scratch(const MhcDims& s, int64_t n_hc);
void mhc_site_bwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const float* fn, const float* base,
                          const float* scale, const MhcActs& a, const float* dcollapsed, const float* dpost,
                          const float* dcomb, float* dX, float* dfn, float* dbase, float* dscale,
                          float* scratch, cudaStream_t stream = nullptr);

void hc_head_fwd_generic(int64_t n_hc, bf16* y, float* mix, float* rstd, float* w, const bf16* X,
                         const float* fn, const float* base, const float* scale, int64_t N, int64_t d,
                         float hc_eps, float rms_eps, cudaStream_t s = nullptr);
inline int64_t hc_head_bwd_generic_scratch(int64_t N, int64_t n_hc) {
  return 2 * N * n_hc;
}
void hc_head_bwd_generic(int64_t n_hc, float* dX, float* dfn, float* dbase, float* dscale, const float* dy,
                         const bf16* X, const float* fn, const float* base, const float* scale,
                         const float* mix, const float* rstd, const float* w, int64_t N, int64_t d,
                         float* scratch, cudaStream_t s = nullptr, bool accumulate = true);

}  // namespace trex::cuda

namespace trex::cuda {

// Dispatch on the stream count: the fast kernels for n_hc = 4, the generic ones otherwise. Scratch sizes
// cover both. dpre (the gate gradients from mhc_collapse_norm_bwd) is used by the fast kernels; the generic ones
// form the same sums themselves (they read the streams anyway).
inline void mhc_site_fwd_any(int64_t n_hc, const MhcDims& s, const bf16* X, const float* fn,
                             const float* base, const float* scale, const MhcActs& a, bf16* collapsed,
                             cudaStream_t stream = nullptr) {
  if (mhc_fast_streams(n_hc))
    mhc_site_fwd(s, X, fn, base, scale, a, collapsed, stream);
  else
    mhc_site_fwd_generic(s, n_hc, X, fn, base, scale, a, collapsed, stream);
}
// The site forward and its RMSNorm on the fp32 collapse (mhc_norm.h): one fused kernel for n_hc = 4 (d <= 10264),
// else the site (no collapse) + mhc_collapse_norm_fwd. Either way mhc_collapse_norm_bwd is the backward's norm.
inline void mhc_site_norm_fwd_any(int64_t n_hc, const MhcDims& s, const bf16* X, const float* fn,
                                  const float* base, const float* scale, const MhcActs& a, const bf16* norm_w,
                                  float norm_eps, bf16* normed, float* norm_rstd, cudaStream_t stream = nullptr) {
  if (mhc_fast_streams(n_hc) && mhc_site_norm_fwd_serves(s.d) && reinterpret_cast<uintptr_t>(norm_w) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(normed) % 16 == 0) {
    mhc_site_norm_fwd(s, X, fn, base, scale, a, norm_w, norm_eps, normed, norm_rstd, stream);
    return;
  }
  mhc_site_fwd_any(n_hc, s, X, fn, base, scale, a, nullptr, stream);
  mhc_collapse_norm_fwd(n_hc, X, a.pre, norm_w, s.n_tok, s.d, norm_eps, normed, norm_rstd, stream);
}
inline void mhc_expand_fwd_any(int64_t n_hc, const MhcDims& s, const bf16* X, const bf16* y,
                               const float* post, const float* comb, bf16* Xout,
                               cudaStream_t stream = nullptr) {
  if (mhc_fast_streams(n_hc))
    mhc_expand_fwd(s, X, y, post, comb, Xout, stream);
  else
    mhc_expand_fwd_generic(s, n_hc, X, y, post, comb, Xout, stream);
}
inline void mhc_expand_bwd_any(int64_t n_hc, const MhcDims& s, const bf16* X, const bf16* y,
                               const float* post, const float* comb, const float* dXout, float* dX, float* dy,
                               float* dpost, float* dcomb, cudaStream_t stream = nullptr, bool accumulate = true,
                               bf16* dy_bf16 = nullptr) {
  if (mhc_fast_streams(n_hc))
    mhc_expand_bwd(s, X, y, post, comb, dXout, dX, dy, dpost, dcomb, stream, accumulate, dy_bf16);
  else
    mhc_expand_bwd_generic(s, n_hc, X, y, post, comb, dXout, dX, dy, dpost, dcomb, stream, accumulate, dy_bf16);
}
inline int64_t mhc_site_bwd_scratch_any(int64_t n_hc, const MhcDims& s) {
  return mhc_fast_streams(n_hc) ? mhc_site_bwd_scratch(s) : mhc_site_bwd_generic_scratch(s, n_hc);
}
inline void mhc_site_bwd_any(int64_t n_hc, const MhcDims& s, const bf16* X, const float* fn,
                             const float* base, const float* scale, const MhcActs& a, const float* dcollapsed,
                             const float* dpost, const float* dcomb, float* dX, float* dfn, float* dbase,
                             float* dscale, float* scratch, cudaStream_t stream = nullptr,
                             const float* dpre = nullptr) {
  if (mhc_fast_streams(n_hc))
    mhc_site_bwd(s, X, fn, base, scale, a, dcollapsed, dpost, dcomb, dX, dfn, dbase, dscale, scratch, stream,
                 dpre);
  else
    mhc_site_bwd_generic(s, n_hc, X, fn, base, scale, a, dcollapsed, dpost, dcomb, dX, dfn, dbase, dscale,
                         scratch, stream);
}

inline void hc_head_fwd_any(int64_t n_hc, bf16* y, float* mix, float* rstd, float* w, const bf16* X,
                            const float* fn, const float* base, const float* scale, int64_t N, int64_t d,
                            float hc_eps, float rms_eps, cudaStream_t s = nullptr) {
  if (mhc_fast_streams(n_hc))
    hc_head_fwd(y, mix, rstd, w, X, fn, base, scale, N, d, hc_eps, rms_eps, s);
  else
    hc_head_fwd_generic(n_hc, y, mix, rstd, w, X, fn, base, scale, N, d, hc_eps, rms_eps, s);
}
inline int64_t hc_head_bwd_scratch_any(int64_t n_hc, int64_t N) {
  return mhc_fast_streams(n_hc) ? hc_head_bwd_scratch(N) : hc_head_bwd_generic_scratch(N, n_hc);
}
inline void hc_head_bwd_any(int64_t n_hc, float* dX, float* dfn, float* dbase, float* dscale, const float* dy,
                            const bf16* X, const float* fn, const float* base, const float* scale,
                            const float* mix, const float* rstd, const float* w, int64_t N, int64_t d,
                            float* scratch, cudaStream_t s = nullptr, const float* dpre = nullptr,
                            bool accumulate = true) {
  if (mhc_fast_streams(n_hc))
    hc_head_bwd(dX, dfn, dbase, dscale, dy, X, fn, base, scale, mix, rstd, w, N, d, scratch, s, dpre, accumulate);
  else
    hc_head_bwd_generic(n_hc, dX, dfn, dbase, dscale, dy, X, fn, base, scale, mix, rstd, w, N, d, scratch, s,
                        accumulate);
}

}  // namespace trex::cuda
