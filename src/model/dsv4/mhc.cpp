#include "model/dsv4/mhc.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm_t.h"

namespace trex::dsv4 {
namespace {

template <class T>
T sigm(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// mix[t] = (fn . x_t) * rstd_t, rstd_t = 1/sqrt(mean(x_t^2) + eps), x_t the flattened streams (D = n_hc*d).
template <class T>
void mix_proj_fwd(const T* X, const T* fn, int64_t n, int64_t D, int64_t M, double eps, T* mix, T* rstd) {
  cpu::gemm_t(mix, X, fn, n, M, D, false, true);
#pragma omp parallel for schedule(static) if (n * D > 32768)
  for (int64_t t = 0; t < n; ++t) {
    const T* x = X + t * D;
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(x[j]) * double(x[j]);
    const T r = T(1.0 / std::sqrt(ss / double(D) + eps));
    rstd[t] = r;
    for (int64_t k = 0; k < M; ++k) mix[t * M + k] *= r;
  }
}

// Backward of mix_proj_fwd. dmix [n, M] is consumed (scaled in place).
template <class T>
void mix_proj_bwd(const T* X, const T* fn, const T* mix, const T* rstd, T* dmix, int64_t n, int64_t D, int64_t M,
                  T* dX, T* dfn) {
  std::vector<T> corr(size_t(n), T(0));
  for (int64_t t = 0; t < n; ++t) {
    double c = 0;
    for (int64_t k = 0; k < M; ++k) c += double(dmix[t * M + k]) * double(mix[t * M + k]);
    corr[size_t(t)] = T(c * double(rstd[t]) * double(rstd[t]) / double(D));
    for (int64_t k = 0; k < M; ++k) dmix[t * M + k] *= rstd[t];
  }
  if (dX) {
    cpu::gemm_t(dX, dmix, fn, n, D, M, false, false, T(1), T(1));
#pragma omp parallel for schedule(static) if (n * D > 32768)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < D; ++j) dX[t * D + j] -= corr[size_t(t)] * X[t * D + j];
  }
  if (dfn) cpu::gemm_t(dfn, dmix, X, M, D, n, true, false, T(1), T(1));
}

// x / (sum + eps) along rows (axis 1) or columns (axis 0) of an n x n matrix, in place.
template <class T>
void normalise(T* m, int64_t n, int axis, double eps) {
  for (int64_t a = 0; a < n; ++a) {
    double s = 0;
    for (int64_t b = 0; b < n; ++b) s += double(axis == 1 ? m[a * n + b] : m[b * n + a]);
    const T inv = T(1.0 / (s + eps));
    for (int64_t b = 0; b < n; ++b) (axis == 1 ? m[a * n + b] : m[b * n + a]) *= inv;
  }
}

// Given the input m of a normalisation and the gradient dy of its output, dm (written into dy's place).
template <class T>
void normalise_bwd(const T* m, T* dy, int64_t n, int axis, double eps) {
  for (int64_t a = 0; a < n; ++a) {
    double s = 0;
    for (int64_t b = 0; b < n; ++b) s += double(axis == 1 ? m[a * n + b] : m[b * n + a]);
    const double inv = 1.0 / (s + eps);
    double dot = 0;  // sum_b dy_b * y_b
    for (int64_t b = 0; b < n; ++b) {
      const int64_t i = axis == 1 ? a * n + b : b * n + a;
      dot += double(dy[i]) * double(m[i]) * inv;
    }
    for (int64_t b = 0; b < n; ++b) {
      const int64_t i = axis == 1 ? a * n + b : b * n + a;
      dy[i] = T((double(dy[i]) - dot) * inv);
    }
  }
}

template <class T>
void row_softmax(const T* z, int64_t n, T* p) {
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, double(z[i * n + j]));
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += std::exp(double(z[i * n + j]) - mx);
    for (int64_t j = 0; j < n; ++j) p[i * n + j] = T(std::exp(double(z[i * n + j]) - mx) / s);
  }
}

}  // namespace

template <class T>
void sinkhorn_fwd(const T* logits, int64_t n, int64_t iters, double eps, T* out) {
  TREX_CHECK(iters >= 1, "hc_sinkhorn_iters must be >= 1, got {}", iters);
  row_softmax(logits, n, out);
  for (int64_t i = 0; i < n * n; ++i) out[i] += T(eps);
  normalise(out, n, 0, eps);
  for (int64_t it = 1; it < iters; ++it) {
    normalise(out, n, 1, eps);
    normalise(out, n, 0, eps);
  }
}

template <class T>
void sinkhorn_bwd(const T* logits, int64_t n, int64_t iters, double eps, const T* dout, T* dlogits) {
  const int64_t nn = n * n;
  const int64_t steps = 2 * iters - 1;  // normalisations: col, then (row, col) x (iters-1)
  // Per-thread scratch: this runs once per token and site, so no heap traffic per call.
  thread_local std::vector<T> inputs, p, cur, g;
  inputs.resize(size_t(steps * nn));
  p.resize(size_t(nn));
  cur.resize(size_t(nn));
  row_softmax(logits, n, p.data());
  for (int64_t i = 0; i < nn; ++i) cur[size_t(i)] = p[size_t(i)] + T(eps);
  for (int64_t s = 0; s < steps; ++s) {
    std::copy(cur.begin(), cur.end(), inputs.begin() + s * nn);
    normalise(cur.data(), n, s % 2 == 0 ? 0 : 1, eps);
  }
  g.assign(dout, dout + nn);
  for (int64_t s = steps - 1; s >= 0; --s) normalise_bwd(inputs.data() + s * nn, g.data(), n, s % 2 == 0 ? 0 : 1, eps);
  for (int64_t i = 0; i < n; ++i) {
    double dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += double(g[size_t(i * n + j)]) * double(p[size_t(i * n + j)]);
    for (int64_t j = 0; j < n; ++j)
      dlogits[i * n + j] = T(double(p[size_t(i * n + j)]) * (double(g[size_t(i * n + j)]) - dot));
  }
}

template <class T>
void mhc_site_fwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale, MhcSiteActs<T>& a,
                  T* collapsed) {
  const int64_t n = s.n_hc, M = s.n_mix(), D = n * s.d;
  mix_proj_fwd(X, fn, s.n_tok, D, M, s.rms_eps, a.mix, a.rstd);
#pragma omp parallel for schedule(static) if (s.n_tok * s.d > 16384)
  for (int64_t t = 0; t < s.n_tok; ++t) {
    const T* mx = a.mix + t * M;
    T* pre = a.pre + t * n;
    T* post = a.post + t * n;
    for (int64_t i = 0; i < n; ++i) {
      pre[i] = sigm(scale[0] * mx[i] + base[i]) + T(s.hc_eps);
      post[i] = T(2) * sigm(scale[1] * mx[n + i] + base[n + i]);
    }
    thread_local std::vector<T> logits;
    logits.resize(size_t(n * n));
    for (int64_t k = 0; k < n * n; ++k) logits[size_t(k)] = scale[2] * mx[2 * n + k] + base[2 * n + k];
    sinkhorn_fwd(logits.data(), n, s.sinkhorn_iters, s.hc_eps, a.comb + t * n * n);
    T* out = collapsed + t * s.d;
    const T* x = X + t * D;
    for (int64_t j = 0; j < s.d; ++j) {
      T acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += pre[i] * x[i * s.d + j];
      out[j] = acc;
    }
  }
}

template <class T>
void mhc_expand_fwd(const MhcShape& s, const T* X, const T* y, const T* post, const T* comb, T* Xout) {
  const int64_t n = s.n_hc, d = s.d;
#pragma omp parallel for schedule(static) if (s.n_tok * d > 16384)
  for (int64_t t = 0; t < s.n_tok; ++t) {
    const T* x = X + t * n * d;
    const T* c = comb + t * n * n;
    const T* yt = y + t * d;
    T* o = Xout + t * n * d;
    for (int64_t j = 0; j < n; ++j) {
      const T pj = post[t * n + j];
      for (int64_t e = 0; e < d; ++e) {
        T acc = pj * yt[e];
        for (int64_t i = 0; i < n; ++i) acc += c[i * n + j] * x[i * d + e];
        o[j * d + e] = acc;
      }
    }
  }
}

template <class T>
void mhc_expand_bwd(const MhcShape& s, const T* X, const T* y, const T* post, const T* comb, const T* dXout, T* dX,
                    T* dy, T* dpost, T* dcomb) {
  const int64_t n = s.n_hc, d = s.d;
#pragma omp parallel for schedule(static) if (s.n_tok * d > 16384)
  for (int64_t t = 0; t < s.n_tok; ++t) {
    const T* x = X + t * n * d;
    const T* c = comb + t * n * n;
    const T* yt = y + t * d;
    const T* g = dXout + t * n * d;
    for (int64_t j = 0; j < n; ++j) {
      double dp = 0;
      for (int64_t e = 0; e < d; ++e) dp += double(g[j * d + e]) * double(yt[e]);
      dpost[t * n + j] = T(dp);
      for (int64_t i = 0; i < n; ++i) {
        double dc = 0;
        for (int64_t e = 0; e < d; ++e) dc += double(g[j * d + e]) * double(x[i * d + e]);
        dcomb[t * n * n + i * n + j] = T(dc);
      }
    }
    T* dyt = dy + t * d;
    for (int64_t e = 0; e < d; ++e) {
      T acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += post[t * n + j] * g[j * d + e];
      dyt[e] += acc;
    }
    T* dx = dX + t * n * d;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < d; ++e) {
        T acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += c[i * n + j] * g[j * d + e];
        dx[i * d + e] += acc;
      }
  }
}

template <class T>
void mhc_site_bwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale,
                  const MhcSiteActs<T>& a, const T* dcollapsed, const T* dpost, const T* dcomb, T* dX, T* dfn,
                  T* dbase, T* dscale, T* scratch) {
  const int64_t n = s.n_hc, M = s.n_mix(), D = n * s.d, d = s.d;
  T* dmix = scratch;
  // Per-token: collapse backward, then the gate / Sinkhorn backward into dmix. Base/scale gradients are reduced
  // afterwards in token order (deterministic).
  std::vector<T> dz(size_t(s.n_tok * M));  // d(pre-activation) per mix slot
#pragma omp parallel for schedule(static) if (s.n_tok * d > 16384)
  for (int64_t t = 0; t < s.n_tok; ++t) {
    const T* x = X + t * D;
    const T* g = dcollapsed + t * d;
    const T* mx = a.mix + t * M;
    T* z = dz.data() + t * M;
    T* dx = dX + t * D;
    for (int64_t i = 0; i < n; ++i) {
      double dp = 0;
      for (int64_t e = 0; e < d; ++e) dp += double(g[e]) * double(x[i * d + e]);
      const T p = a.pre[t * n + i];
      for (int64_t e = 0; e < d; ++e) dx[i * d + e] += p * g[e];
      const T sg = sigm(scale[0] * mx[i] + base[i]);
      z[i] = T(dp) * sg * (T(1) - sg);
      const T sp = sigm(scale[1] * mx[n + i] + base[n + i]);
      z[n + i] = dpost[t * n + i] * T(2) * sp * (T(1) - sp);
    }
    thread_local std::vector<T> logits;
    logits.resize(size_t(n * n));
    for (int64_t k = 0; k < n * n; ++k) logits[size_t(k)] = scale[2] * mx[2 * n + k] + base[2 * n + k];
    sinkhorn_bwd(logits.data(), n, s.sinkhorn_iters, s.hc_eps, dcomb + t * n * n, z + 2 * n);
    for (int64_t k = 0; k < M; ++k) dmix[t * M + k] = z[k] * scale[k < n ? 0 : (k < 2 * n ? 1 : 2)];
  }
  for (int64_t k = 0; k < M; ++k) {
    double db = 0, ds = 0;
    for (int64_t t = 0; t < s.n_tok; ++t) {
      db += double(dz[size_t(t * M + k)]);
      ds += double(dz[size_t(t * M + k)]) * double(a.mix[t * M + k]);
    }
    if (dbase) dbase[k] += T(db);
    if (dscale) dscale[k < n ? 0 : (k < 2 * n ? 1 : 2)] += T(ds);
  }
  mix_proj_bwd(X, fn, a.mix, a.rstd, dmix, s.n_tok, D, M, dX, dfn);
}

template <class T>
void hc_head_fwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale, T* mix, T* rstd, T* w,
                 T* y) {
  const int64_t n = s.n_hc, d = s.d, D = n * d;
  mix_proj_fwd(X, fn, s.n_tok, D, n, s.rms_eps, mix, rstd);
#pragma omp parallel for schedule(static) if (s.n_tok * d > 16384)
  for (int64_t t = 0; t < s.n_tok; ++t) {
    for (int64_t i = 0; i < n; ++i) w[t * n + i] = sigm(scale[0] * mix[t * n + i] + base[i]) + T(s.hc_eps);
    const T* x = X + t * D;
    for (int64_t e = 0; e < d; ++e) {
      T acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += w[t * n + i] * x[i * d + e];
      y[t * d + e] = acc;
    }
  }
}

template <class T>
void hc_head_bwd(const MhcShape& s, const T* X, const T* fn, const T* base, const T* scale, const T* mix,
                 const T* rstd, const T* w, const T* dy, T* dX, T* dfn, T* dbase, T* dscale, T* scratch) {
  const int64_t n = s.n_hc, d = s.d, D = n * d;
  std::vector<T> dz(size_t(s.n_tok * n));
#pragma omp parallel for schedule(static) if (s.n_tok * d > 16384)
  for (int64_t t = 0; t < s.n_tok; ++t) {
    const T* x = X + t * D;
    const T* g = dy + t * d;
    T* dx = dX + t * D;
    for (int64_t i = 0; i < n; ++i) {
      double dw = 0;
      for (int64_t e = 0; e < d; ++e) dw += double(g[e]) * double(x[i * d + e]);
      for (int64_t e = 0; e < d; ++e) dx[i * d + e] += w[t * n + i] * g[e];
      const T sg = sigm(scale[0] * mix[t * n + i] + base[i]);
      dz[size_t(t * n + i)] = T(dw) * sg * (T(1) - sg);
      scratch[t * n + i] = dz[size_t(t * n + i)] * scale[0];
    }
  }
  double ds = 0;
  for (int64_t i = 0; i < n; ++i) {
    double db = 0;
    for (int64_t t = 0; t < s.n_tok; ++t) {
      db += double(dz[size_t(t * n + i)]);
      ds += double(dz[size_t(t * n + i)]) * double(mix[t * n + i]);
    }
    if (dbase) dbase[i] += T(db);
  }
  if (dscale) dscale[0] += T(ds);
  mix_proj_bwd(X, fn, mix, rstd, scratch, s.n_tok, D, n, dX, dfn);
}

#define TREX_MHC_INSTANTIATE(T)                                                                                    \
  template void sinkhorn_fwd<T>(const T*, int64_t, int64_t, double, T*);                                           \
  template void sinkhorn_bwd<T>(const T*, int64_t, int64_t, double, const T*, T*);                                 \
  template void mhc_site_fwd<T>(const MhcShape&, const T*, const T*, const T*, const T*, MhcSiteActs<T>&, T*);     \
  template void mhc_expand_fwd<T>(const MhcShape&, const T*, const T*, const T*, const T*, T*);                    \
  template void mhc_expand_bwd<T>(const MhcShape&, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,   \
                                  T*);                                                                             \
  template void mhc_site_bwd<T>(const MhcShape&, const T*, const T*, const T*, const T*, const MhcSiteActs<T>&,    \
                                const T*, const T*, const T*, T*, T*, T*, T*, T*);                                 \
  template void hc_head_fwd<T>(const MhcShape&, const T*, const T*, const T*, const T*, T*, T*, T*, T*);           \
  template void hc_head_bwd<T>(const MhcShape&, const T*, const T*, const T*, const T*, const T*, const T*,        \
                               const T*, const T*, T*, T*, T*, T*, T*);
TREX_MHC_INSTANTIATE(float)
TREX_MHC_INSTANTIATE(double)

}  // namespace trex::dsv4
