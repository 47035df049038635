#include "model/dsv4/head.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm_t.h"
#include "model/dsv4/norm.h"

namespace trex::dsv4 {

template <class T>
HeadActs<T> head_acts_bind(int64_t n, int64_t n_hc, int64_t d, T* buf, T* logits) {
  HeadActs<T> a;
  a.mix = buf, buf += n * n_hc;
  a.hc_rstd = buf, buf += n;
  a.w = buf, buf += n * n_hc;
  a.collapsed = buf, buf += n * d;
  a.norm_rstd = buf, buf += n;
  a.normed = buf;
  a.logits = logits;
  return a;
}

template <class T>
void head_fwd(const MhcShape& s, int64_t vocab, const T* X, const HeadParams<T>& p, HeadActs<T>& a) {
  hc_head_fwd(s, X, p.hc_fn, p.hc_base, p.hc_scale, a.mix, a.hc_rstd, a.w, a.collapsed);
  norm_fwd(a.collapsed, p.norm, s.n_tok, s.d, s.rms_eps, a.normed, a.norm_rstd);
  if (a.logits) cpu::linear_fwd_t(a.logits, a.normed, p.head, s.n_tok, s.d, vocab);
}

template <class T>
void head_bwd(const MhcShape& s, int64_t vocab, const T* X, const HeadParams<T>& p, const HeadActs<T>& a,
              const T* dlogits, T* dX, HeadGrads<T>& g, T* scratch) {
  const int64_t n = s.n_tok, d = s.d;
  T* dnormed = scratch;
  std::fill(dnormed, dnormed + n * d, T(0));
  cpu::linear_bwd_t(dnormed, g.head, dlogits, a.normed, p.head, n, d, vocab);
  std::vector<T> dcol(size_t(n * d), T(0));
  norm_bwd(a.collapsed, p.norm, a.norm_rstd, dnormed, n, d, dcol.data(), g.norm);
  hc_head_bwd(s, X, p.hc_fn, p.hc_base, p.hc_scale, a.mix, a.hc_rstd, a.w, dcol.data(), dX, g.hc_fn, g.hc_base,
              g.hc_scale, scratch + n * d);
}

template HeadActs<float> head_acts_bind<float>(int64_t, int64_t, int64_t, float*, float*);
template HeadActs<double> head_acts_bind<double>(int64_t, int64_t, int64_t, double*, double*);
template void head_fwd<float>(const MhcShape&, int64_t, const float*, const HeadParams<float>&, HeadActs<float>&);
template void head_fwd<double>(const MhcShape&, int64_t, const double*, const HeadParams<double>&,
                               HeadActs<double>&);
template void head_bwd<float>(const MhcShape&, int64_t, const float*, const HeadParams<float>&,
                              const HeadActs<float>&, const float*, float*, HeadGrads<float>&, float*);
template void head_bwd<double>(const MhcShape&, int64_t, const double*, const HeadParams<double>&,
                               const HeadActs<double>&, const double*, double*, HeadGrads<double>&, double*);

}  // namespace trex::dsv4
