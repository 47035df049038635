#include "model/dsv4/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/gemm_t.h"
#include "kernels/cpu/swiglu.h"

namespace trex::dsv4 {
namespace {

// sqrt(softplus(z)) and its derivative sigmoid(z) / (2 sqrt(softplus(z))), stable for large |z|.
template <class T>
T softplus(T z) {
  return z > T(20) ? z : std::log1p(std::exp(z));
}

}  // namespace

MoeActSizes moe_act_sizes(const MoeShape& s) {
  MoeActSizes r;
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk;
  r.t_elems = 2 * N * E + N * K + 2 * N * K * s.inter + 2 * N * s.shared_inter;
  r.i32_elems = N * K + N * K + E + 1;
  return r;
}

template <class T>
MoeActs<T> moe_acts_bind(const MoeShape& s, T* tb, int32_t* ib) {
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk;
  MoeActs<T> a;
  a.logits = tb, tb += N * E;
  a.scores = tb, tb += N * E;
  a.weight = tb, tb += N * K;
  a.gate_pre = tb, tb += N * K * s.inter;
  a.up_pre = tb, tb += N * K * s.inter;
  a.sh_gate = tb, tb += N * s.shared_inter;
  a.sh_up = tb, tb += N * s.shared_inter;
  a.sel = ib, ib += N * K;
  a.order = ib, ib += N * K;
  a.offsets = ib;
  return a;
}

template <class T>
void moe_fwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const int32_t* token_ids, MoeActs<T>& a, T* out) {
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk, d = s.d, f = s.inter;
  TREX_CHECK(K >= 1 && K <= E, "MoE: top-k {} out of range for {} experts", K, E);
  cpu::linear_fwd_t(a.logits, u, w.gate, N, d, E);
  for (int64_t i = 0; i < N * E; ++i) a.scores[i] = std::sqrt(softplus(a.logits[i]));
  // Selection.
  for (int64_t t = 0; t < N; ++t) {
    int32_t* sel = a.sel + t * K;
    const T* sc = a.scores + t * E;
    if (s.hash) {
      TREX_CHECK(w.tid2eid && token_ids, "MoE: hash routing needs tid2eid and token ids");
      const int64_t tok = token_ids[t];
      TREX_CHECK(tok >= 0 && tok < w.vocab, "MoE: token id {} outside tid2eid rows [0, {})", tok, w.vocab);
      for (int64_t k = 0; k < K; ++k) {
        sel[k] = w.tid2eid[tok * K + k];
        TREX_CHECK(sel[k] >= 0 && sel[k] < E, "MoE: tid2eid[{}] holds expert {} outside [0, {})", tok, sel[k], E);
      }
    } else {
      std::vector<int32_t> idx(static_cast<size_t>(E));
      std::iota(idx.begin(), idx.end(), 0);
      auto key = [&](int32_t e) { return double(sc[e]) + (w.bias ? double(w.bias[e]) : 0.0); };
      std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t x, int32_t y) {
        const double kx = key(x), ky = key(y);
        return kx > ky || (kx == ky && x < y);
      });
      for (int64_t k = 0; k < K; ++k) sel[k] = idx[size_t(k)];
    }
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += double(sc[sel[k]]);
    for (int64_t k = 0; k < K; ++k) a.weight[t * K + k] = T(s.routed_scale * double(sc[sel[k]]) / (sum + 1e-20));
  }
  // Group routed slots by expert (stable: token order within an expert).
  std::fill(a.offsets, a.offsets + E + 1, 0);
  for (int64_t r = 0; r < N * K; ++r) a.offsets[a.sel[r] + 1]++;
  for (int64_t e = 0; e < E; ++e) a.offsets[e + 1] += a.offsets[e];
  {
    std::vector<int32_t> fill(a.offsets, a.offsets + E);
    for (int64_t r = 0; r < N * K; ++r) a.order[fill[size_t(a.sel[r])]++] = int32_t(r);
  }
  std::fill(out, out + N * d, T(0));
  int64_t max_rows = 0;
  for (int64_t e = 0; e < E; ++e) max_rows = std::max<int64_t>(max_rows, a.offsets[e + 1] - a.offsets[e]);
  std::vector<T> xe(size_t(max_rows * d)), h(size_t(max_rows * f)), ye(size_t(max_rows * d));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], n = a.offsets[e + 1] - r0;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; ++i) std::copy_n(u + (a.order[r0 + i] / K) * d, d, xe.data() + i * d);
    T* gp = a.gate_pre + r0 * f;
    T* up = a.up_pre + r0 * f;
    cpu::linear_fwd_t(gp, xe.data(), w.w1 + e * f * d, n, d, f);
    cpu::linear_fwd_t(up, xe.data(), w.w3 + e * f * d, n, d, f);
    cpu::swiglu_fwd(h.data(), gp, up, n * f, s.swiglu_limit);
    for (int64_t i = 0; i < n; ++i) {
      const T g = a.weight[a.order[r0 + i]];
      for (int64_t j = 0; j < f; ++j) h[size_t(i * f + j)] *= g;
    }
    cpu::linear_fwd_t(ye.data(), h.data(), w.w2 + e * d * f, n, f, d);
    for (int64_t i = 0; i < n; ++i) {
      T* o = out + (a.order[r0 + i] / K) * d;
      for (int64_t j = 0; j < d; ++j) o[j] += ye[size_t(i * d + j)];
    }
  }
  if (s.shared_inter > 0) {
    const int64_t fs = s.shared_inter;
    std::vector<T> hs(size_t(N * fs));
    cpu::linear_fwd_t(a.sh_gate, u, w.sw1, N, d, fs);
    cpu::linear_fwd_t(a.sh_up, u, w.sw3, N, d, fs);
    cpu::swiglu_fwd(hs.data(), a.sh_gate, a.sh_up, N * fs, s.swiglu_limit);
    cpu::gemm_t(out, hs.data(), w.sw2, N, d, fs, false, true, T(1), T(1));
  }
}

template <class T>
void moe_bwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const MoeActs<T>& a, const T* dout,
             const T* dscores_extra, T* du, MoeGrads<T>& g) {
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk, d = s.d, f = s.inter;
  std::vector<T> dweight(size_t(N * K), T(0));
  int64_t max_rows = 0;
  for (int64_t e = 0; e < E; ++e) max_rows = std::max<int64_t>(max_rows, a.offsets[e + 1] - a.offsets[e]);
  std::vector<T> xe(size_t(max_rows * d)), dye(size_t(max_rows * d)), h(size_t(max_rows * f)),
      hs(size_t(max_rows * f)), dh(size_t(max_rows * f)), dg(size_t(max_rows * f)), dup(size_t(max_rows * f)),
      dxe(size_t(max_rows * d));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[e], n = a.offsets[e + 1] - r0;
    if (n == 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = a.order[r0 + i] / K;
      std::copy_n(u + t * d, d, xe.data() + i * d);
      std::copy_n(dout + t * d, d, dye.data() + i * d);
    }
    const T* gp = a.gate_pre + r0 * f;
    const T* up = a.up_pre + r0 * f;
    cpu::swiglu_fwd(h.data(), gp, up, n * f, s.swiglu_limit);
    for (int64_t i = 0; i < n; ++i) {
      const T gw = a.weight[a.order[r0 + i]];
      for (int64_t j = 0; j < f; ++j) hs[size_t(i * f + j)] = gw * h[size_t(i * f + j)];
    }
    // y = (g h) W2^T: dW2 += dy^T (g h); d(g h) = dy W2
    std::fill(dh.begin(), dh.begin() + n * f, T(0));
    cpu::linear_bwd_t(dh.data(), g.w2 ? g.w2 + e * d * f : nullptr, dye.data(), hs.data(), w.w2 + e * d * f, n, f,
                      d);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = a.order[r0 + i];
      double dgw = 0;
      for (int64_t j = 0; j < f; ++j) dgw += double(dh[size_t(i * f + j)]) * double(h[size_t(i * f + j)]);
      dweight[size_t(slot)] = T(dgw);
      const T gw = a.weight[slot];
      for (int64_t j = 0; j < f; ++j) dh[size_t(i * f + j)] *= gw;
    }
    cpu::swiglu_bwd(dg.data(), dup.data(), dh.data(), gp, up, n * f, s.swiglu_limit);
    std::fill(dxe.begin(), dxe.begin() + n * d, T(0));
    cpu::linear_bwd_t(dxe.data(), g.w1 ? g.w1 + e * f * d : nullptr, dg.data(), xe.data(), w.w1 + e * f * d, n, d, f);
    cpu::linear_bwd_t(dxe.data(), g.w3 ? g.w3 + e * f * d : nullptr, dup.data(), xe.data(), w.w3 + e * f * d, n, d,
                      f);
    for (int64_t i = 0; i < n; ++i) {
      T* o = du + (a.order[r0 + i] / K) * d;
      for (int64_t j = 0; j < d; ++j) o[j] += dxe[size_t(i * d + j)];
    }
  }
  // Router: g_k = rho s_k / (S + 1e-20), S = sum_k s_k; then s = sqrt(softplus(z)).
  std::vector<T> dlogits(size_t(N * E), T(0));
  for (int64_t t = 0; t < N; ++t) {
    const int32_t* sel = a.sel + t * K;
    const T* sc = a.scores + t * E;
    std::vector<double> ds(size_t(E), 0.0);
    if (dscores_extra)
      for (int64_t e = 0; e < E; ++e) ds[size_t(e)] = double(dscores_extra[t * E + e]);
    double S = 0, dot = 0;
    for (int64_t k = 0; k < K; ++k) S += double(sc[sel[k]]);
    for (int64_t k = 0; k < K; ++k) dot += double(dweight[size_t(t * K + k)]) * double(sc[sel[k]]);
    const double den = S + 1e-20;
    for (int64_t k = 0; k < K; ++k)
      ds[size_t(sel[k])] += s.routed_scale * (double(dweight[size_t(t * K + k)]) / den - dot / (den * den));
    for (int64_t e = 0; e < E; ++e) {
      if (ds[size_t(e)] == 0.0) continue;
      const double z = double(a.logits[t * E + e]);
      const double sq = double(sc[e]);
      const double sig = 1.0 / (1.0 + std::exp(-z));
      dlogits[size_t(t * E + e)] = T(ds[size_t(e)] * sig / (2.0 * sq));
    }
  }
  cpu::linear_bwd_t(du, g.gate, dlogits.data(), u, w.gate, N, d, E);
  if (s.shared_inter > 0) {
    const int64_t fs = s.shared_inter;
    std::vector<T> hsh(size_t(N * fs)), dhs(size_t(N * fs), T(0)), dgs(size_t(N * fs)), dus(size_t(N * fs));
    cpu::swiglu_fwd(hsh.data(), a.sh_gate, a.sh_up, N * fs, s.swiglu_limit);
    cpu::linear_bwd_t(dhs.data(), g.sw2, dout, hsh.data(), w.sw2, N, fs, d);
    cpu::swiglu_bwd(dgs.data(), dus.data(), dhs.data(), a.sh_gate, a.sh_up, N * fs, s.swiglu_limit);
    cpu::linear_bwd_t(du, g.sw1, dgs.data(), u, w.sw1, N, d, fs);
    cpu::linear_bwd_t(du, g.sw3, dus.data(), u, w.sw3, N, d, fs);
  }
}

void moe_expert_load(const int32_t* sel, int64_t n_tok, int64_t topk, int64_t n_experts, int64_t* load) {
  std::fill(load, load + n_experts, int64_t{0});
  for (int64_t r = 0; r < n_tok * topk; ++r) load[sel[r]]++;
}

void router_bias_update(float* bias, const int64_t* load, int64_t n_experts, double rate) {
  double mean = 0;
  for (int64_t e = 0; e < n_experts; ++e) mean += double(load[e]);
  mean /= double(n_experts);
  for (int64_t e = 0; e < n_experts; ++e) {
    const double diff = mean - double(load[e]);
    bias[e] += float(rate * (diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0)));
  }
}

#define TREX_MOE_INSTANTIATE(T)                                                                               \
  template MoeActs<T> moe_acts_bind<T>(const MoeShape&, T*, int32_t*);                                        \
  template void moe_fwd<T>(const MoeShape&, const MoeWeights<T>&, const T*, const int32_t*, MoeActs<T>&, T*); \
  template void moe_bwd<T>(const MoeShape&, const MoeWeights<T>&, const T*, const MoeActs<T>&, const T*,      \
                           const T*, T*, MoeGrads<T>&);
TREX_MOE_INSTANTIATE(float)
TREX_MOE_INSTANTIATE(double)

}  // namespace trex::dsv4
