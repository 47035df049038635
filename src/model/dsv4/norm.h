// Weighted RMSNorm block (attn_norm, ffn_norm, final norm, MTP enorm/hnorm/norm; design §2.13): the model-level
// wrapper over kernels/cpu/rmsnorm.h keeping the per-row rstd for the backward.
#pragma once
#include <cstdint>

#include "kernels/cpu/rmsnorm.h"

namespace trex::dsv4 {

// y[n, d] = w * x / RMS(x); rstd[n] kept.
template <class T>
inline void norm_fwd(const T* x, const T* w, int64_t n, int64_t d, double eps, T* y, T* rstd) {
  cpu::rmsnorm_fwd(y, rstd, x, w, n, d, eps);
}
// dx += ..., dw += ... (dw nullable).
template <class T>
inline void norm_bwd(const T* x, const T* w, const T* rstd, const T* dy, int64_t n, int64_t d, T* dx, T* dw) {
  cpu::rmsnorm_bwd(dx, dw, dy, x, w, rstd, n, d);
}

}  // namespace trex::dsv4
