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
  r.t_elems = 2 * N * E + N * K + N * K * s.d + 2 * N * s.shared_inter;
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
  a.y_slots = tb, tb += N * K * s.d;
  a.sh_gate = tb, tb += N * s.shared_inter;
  a.sh_up = tb, tb += N * s.shared_inter;
  a.sel = ib, ib += N * K;
  a.order = ib, ib += N * K;
  a.offsets = ib;
  return a;
}

namespace {

// Router: logits, scores, selection, gate weights, and this rank's expert-sorted slot order.
template <class T>
void router_fwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const int32_t* token_ids, MoeActs<T>& a) {
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk, d = s.d;
  TREX_CHECK(K >= 1 && K <= E, "MoE: top-k {} out of range for {} experts", K, E);
  cpu::linear_fwd_t(a.logits, u, w.gate, N, d, E);
  for (int64_t i = 0; i < N * E; ++i) a.scores[i] = std::sqrt(softplus(a.logits[i]));
  std::vector<int32_t> idx(static_cast<size_t>(E));
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
  // Group this rank's slots by expert (stable: token order within an expert).
  std::fill(a.offsets, a.offsets + E + 1, 0);
  for (int64_t r = 0; r < N * K; ++r) a.offsets[a.sel[r] + 1]++;
  for (int64_t e = 0; e < E; ++e) a.offsets[e + 1] += a.offsets[e];
  std::vector<int32_t> fill(a.offsets, a.offsets + E);
  for (int64_t r = 0; r < N * K; ++r) a.order[fill[size_t(a.sel[r])]++] = int32_t(r);
}

int64_t total_rows(const std::vector<int64_t>& counts) {
  int64_t r = 0;
  for (int64_t c : counts) r += c;
  return r;
}

}  // namespace

template <class T>
void moe_fwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const int32_t* token_ids, MoeActs<T>& a, T* out,
             ExpertExchange<T>* ex, const ExchangeKey& key) {
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk, d = s.d, f = s.inter;
  router_fwd(s, w, u, token_ids, a);
  LocalExpertExchange<T> local(E);
  if (!ex) ex = &local;
  a.counts = ex->plan(key, a.sel, N, K, d);
  TREX_CHECK(int64_t(a.counts.size()) == ex->expert_end() - ex->expert_begin(),
             "MoE layer {}: the exchange planned {} experts but holds [{}, {})", key.layer, a.counts.size(),
             ex->expert_begin(), ex->expert_end());
  ex->dispatch(key, u, false);

  // The shared expert, while the routed rows travel.
  if (s.shared_inter > 0) {
    const int64_t fs = s.shared_inter;
    std::vector<T> hs(size_t(N * fs));
    cpu::linear_fwd_t(a.sh_gate, u, w.sw1, N, d, fs);
    cpu::linear_fwd_t(a.sh_up, u, w.sw3, N, d, fs);
    cpu::swiglu_fwd(hs.data(), a.sh_gate, a.sh_up, N * fs, s.swiglu_limit);
    cpu::gemm_t(out, hs.data(), w.sw2, N, d, fs, false, true, T(1), T(0));
  } else {
    std::fill(out, out + N * d, T(0));
  }

  // The local experts on their grouped rows: y = swiglu(x W1^T, x W3^T) W2^T, unweighted.
  const int64_t R = total_rows(a.counts);
  const T* xg = ex->dispatch_wait(key);
  a.x_rows.assign(xg, xg + R * d);
  a.gate_pre.resize(size_t(R * f));
  a.up_pre.resize(size_t(R * f));
  std::vector<T> h(size_t(R * f)), ye(size_t(R * d));
  for (int64_t j = 0, r0 = 0; j < int64_t(a.counts.size()); r0 += a.counts[size_t(j)], ++j) {
    const int64_t n = a.counts[size_t(j)];
    if (n == 0) continue;
    cpu::linear_fwd_t(a.gate_pre.data() + r0 * f, a.x_rows.data() + r0 * d, w.w1 + j * f * d, n, d, f);
    cpu::linear_fwd_t(a.up_pre.data() + r0 * f, a.x_rows.data() + r0 * d, w.w3 + j * f * d, n, d, f);
  }
  cpu::swiglu_fwd(h.data(), a.gate_pre.data(), a.up_pre.data(), R * f, s.swiglu_limit);
  for (int64_t j = 0, r0 = 0; j < int64_t(a.counts.size()); r0 += a.counts[size_t(j)], ++j) {
    const int64_t n = a.counts[size_t(j)];
    if (n > 0) cpu::linear_fwd_t(ye.data() + r0 * d, h.data() + r0 * f, w.w2 + j * d * f, n, f, d);
  }
  ex->combine(key, ye.data());
  ex->combine_wait(key, a.y_slots);

  // Gate weighting and the sum over slots, on the token's rank.
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const T gk = a.weight[t * K + k];
      const T* y = a.y_slots + (t * K + k) * d;
      T* o = out + t * d;
      for (int64_t j = 0; j < d; ++j) o[j] += gk * y[j];
    }
}

template <class T>
void moe_bwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const MoeActs<T>& a, const T* dout,
             const T* dscores_extra, T* du, MoeGrads<T>& g, ExpertExchange<T>* ex, const ExchangeKey& key) {
  const int64_t N = s.n_tok, E = s.n_experts, K = s.topk, d = s.d, f = s.inter;
  LocalExpertExchange<T> local(E);
  if (!ex) {
    ex = &local;
    local.plan(key, a.sel, N, K, d);
  }
  // Combine backward on the token's rank: dg_k = <dout_t, y_{t,k}>, dy_{t,k} = g_k dout_t, sent to the experts.
  std::vector<T> dweight(size_t(N * K)), dslots(size_t(N * K * d));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t slot = t * K + k;
      const T* y = a.y_slots + slot * d;
      const T* dy = dout + t * d;
      const T gk = a.weight[slot];
      double dot = 0;
      for (int64_t j = 0; j < d; ++j) {
        dot += double(dy[j]) * double(y[j]);
        dslots[size_t(slot * d + j)] = gk * dy[j];
      }
      dweight[size_t(slot)] = T(dot);
    }
  ex->dispatch(key, dslots.data(), true);

  // While the gradients travel: the router, g_k = rho s_k / (S + 1e-20), S = sum_k s_k, s = sqrt(softplus(z)) ...
  std::vector<T> dlogits(size_t(N * E), T(0));
  std::vector<double> ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    const int32_t* sel = a.sel + t * K;
    const T* sc = a.scores + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
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
  // ... and the shared expert.
  if (s.shared_inter > 0) {
    const int64_t fs = s.shared_inter;
    std::vector<T> hsh(size_t(N * fs)), dhs(size_t(N * fs), T(0)), dgs(size_t(N * fs)), dus(size_t(N * fs));
    cpu::swiglu_fwd(hsh.data(), a.sh_gate, a.sh_up, N * fs, s.swiglu_limit);
    cpu::linear_bwd_t(dhs.data(), g.sw2, dout, hsh.data(), w.sw2, N, fs, d);
    cpu::swiglu_bwd(dgs.data(), dus.data(), dhs.data(), a.sh_gate, a.sh_up, N * fs, s.swiglu_limit);
    cpu::linear_bwd_t(du, g.sw1, dgs.data(), u, w.sw1, N, d, fs);
    cpu::linear_bwd_t(du, g.sw3, dus.data(), u, w.sw3, N, d, fs);
  }

  // The local experts on the grouped output gradients.
  const int64_t R = total_rows(a.counts);
  TREX_CHECK(int64_t(a.x_rows.size()) == R * d && int64_t(a.gate_pre.size()) == R * f,
             "MoE layer {}: backward without the forward's expert rows ({} rows planned)", key.layer, R);
  const T* dyg = ex->dispatch_wait(key);
  std::vector<T> h(size_t(R * f)), dh(size_t(R * f), T(0)), dg(size_t(R * f)), dup(size_t(R * f)),
      dxg(size_t(R * d), T(0));
  cpu::swiglu_fwd(h.data(), a.gate_pre.data(), a.up_pre.data(), R * f, s.swiglu_limit);
  for (int64_t j = 0, r0 = 0; j < int64_t(a.counts.size()); r0 += a.counts[size_t(j)], ++j) {
    const int64_t n = a.counts[size_t(j)];
    if (n > 0)  // y = h W2^T: dW2 += dy^T h, dh = dy W2
      cpu::linear_bwd_t(dh.data() + r0 * f, g.w2 ? g.w2 + j * d * f : nullptr, dyg + r0 * d, h.data() + r0 * f,
                        w.w2 + j * d * f, n, f, d);
  }
  cpu::swiglu_bwd(dg.data(), dup.data(), dh.data(), a.gate_pre.data(), a.up_pre.data(), R * f, s.swiglu_limit);
  for (int64_t j = 0, r0 = 0; j < int64_t(a.counts.size()); r0 += a.counts[size_t(j)], ++j) {
    const int64_t n = a.counts[size_t(j)];
    if (n == 0) continue;
    const T* x = a.x_rows.data() + r0 * d;
    cpu::linear_bwd_t(dxg.data() + r0 * d, g.w1 ? g.w1 + j * f * d : nullptr, dg.data() + r0 * f, x,
                      w.w1 + j * f * d, n, d, f);
    cpu::linear_bwd_t(dxg.data() + r0 * d, g.w3 ? g.w3 + j * f * d : nullptr, dup.data() + r0 * f, x,
                      w.w3 + j * f * d, n, d, f);
  }
  // Back to the tokens' ranks; each token's input gradient is the sum over its slots.
  ex->combine(key, dxg.data());
  ex->combine_wait(key, dslots.data());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const T* src = dslots.data() + (t * K + k) * d;
      T* o = du + t * d;
      for (int64_t j = 0; j < d; ++j) o[j] += src[j];
    }
  ex->release(key);
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
  template void moe_fwd<T>(const MoeShape&, const MoeWeights<T>&, const T*, const int32_t*, MoeActs<T>&, T*,  \
                           ExpertExchange<T>*, const ExchangeKey&);                                           \
  template void moe_bwd<T>(const MoeShape&, const MoeWeights<T>&, const T*, const MoeActs<T>&, const T*,      \
                           const T*, T*, MoeGrads<T>&, ExpertExchange<T>*, const ExchangeKey&);
TREX_MOE_INSTANTIATE(float)
TREX_MOE_INSTANTIATE(double)

}  // namespace trex::dsv4
