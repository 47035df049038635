// Manifold-constrained hyper-connections (design §2.2): the per-site mixing (pre / post / comb via Sinkhorn), the
// collapse into the sub-layer input, the expand back into n_hc streams, and the final hc_head collapse.
// Streams are [N, n_hc, d] (N = B*S tokens), fp32 or fp64. Every backward accumulates into the gradient outputs
// named d*, except where a comment says "written".
#pragma once
#include <cstdint>

namespace trex::dsv4 {

struct MhcShape {
  int64_t n_tok = 0;
  int64_t n_hc = 4;
  int64_t d = 0;
  int64_t sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_eps = 1e-6;
  int64_t n_mix() const { return (2 + n_hc) * n_hc; }  // pre, post, comb (row-major n_hc x n_hc)
};

// Sinkhorn projection of one n x n logit matrix, exactly as the reference: row softmax, + eps, column
// normalisation, then (iters - 1) x (row, column) normalisations, each x / (sum + eps).
template <class T>
void sinkhorn_fwd(const T* logits, int64_t n, int64_t iters, double eps, T* out);
// dlogits (written) from dout, recomputing the forward iterations.
template <class T>
void sinkhorn_bwd(const T* logits, int64_t n, int64_t iters, double eps, const T* dout, T* dlogits);

// Activations one site keeps for its backward pass.
template <class T>
struct MhcSiteActs {
  T* mix = nullptr;   // [N, n_mix]: (fn . x) / RMS(x)
  T* rstd = nullptr;  // [N]
  T* pre = nullptr;   // [N, n_hc]
  T* post = nullptr;  // [N, n_hc]
  T* comb = nullptr;  // [N, n_hc, n_hc], comb[i][j]: input stream i -> output stream j
};

// Mixing weights from the streams X, and the collapsed sub-layer input x_in[N, d] = sum_i pre_i X[i].
template <class T>
void mhc_site_fwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale, MhcSiteActs<T>& a,
                  T* collapsed);
// Xout[t, j] = post_j * y[t] + sum_i comb[i][j] * X[t, i]
template <class T>
void mhc_expand_fwd(const MhcShape& s, const T* X, const T* y, const T* post, const T* comb, T* Xout);
// Backward of the expand: dX += comb-mix of dXout; dy += sum_j post_j dXout_j; dpost, dcomb are WRITTEN.
template <class T>
void mhc_expand_bwd(const MhcShape& s, const T* X, const T* y, const T* post, const T* comb, const T* dXout, T* dX,
                    T* dy, T* dpost, T* dcomb);
// Backward of the site (collapse + mixing): from d(collapsed) and the expand's dpost/dcomb, accumulates dX and
// the parameter gradients. scratch: n_tok * n_mix elements.
template <class T>
void mhc_site_bwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale,
                  const MhcSiteActs<T>& a, const T* dcollapsed, const T* dpost, const T* dcomb, T* dX, T* dfn,
                  T* dbase, T* dscale, T* scratch);

// hc_head: w_i = sigmoid(scale * mix_i + base_i) + eps with mix = (fn . x)/RMS(x), y = sum_i w_i X[i].
// fn [n_hc, n_hc*d], base [n_hc], scale [1]. Acts: mix [N, n_hc], rstd [N], w [N, n_hc].
template <class T>
void hc_head_fwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale, T* mix, T* rstd, T* w,
                 T* y);
// scratch: n_tok * n_hc elements.
template <class T>
void hc_head_bwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale, const T* mix,
                 const T* rstd, const T* w, const T* dy, T* dX, T* dfn, T* dbase, T* dscale, T* scratch);

}  // namespace trex::dsv4
