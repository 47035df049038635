#include "model/dsv4/indexer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/attention_blas.h"

namespace trex::dsv4 {
namespace {

constexpr int64_t kParallelWork = int64_t(1) << 17;  // smaller loops stay on one thread

template <typename T>
T score_of(const IndexerDims& dims, const T* q_t, const T* w_t, const T* key) {
  const int64_t cI = dims.head_dim;
  T s = 0;
  for (int64_t h = 0; h < dims.n_heads; ++h) {
    T u = 0;
    for (int64_t k = 0; k < cI; ++k) u += q_t[h * cI + k] * key[k];
    if (u > 0) s += w_t[h] * u;
  }
  return s / std::sqrt(T(cI));
}

}  // namespace

template <typename T>
void indexer_forward(const IndexerParamsT<T>& p, const IndexerDims& dims, const CompressPlan& plan,
                     const SeqLayout& layout, const RopeTable<T>& rope, const T* a, const T* cq, int64_t* sel,
                     IndexerSaved<T>& saved) {
  const int64_t N = layout.n_tokens(), nI = dims.n_heads, cI = dims.head_dim, k_sel = dims.k_sel;
  const int64_t E = plan.n_entries, n_pairs = dims.rope_dim / 2;
  CompressorDims cd{dims.d, cI, dims.rope_dim, true, dims.eps};
  saved.keys.resize(size_t(E * cI));
  compressor_forward(p.compressor, cd, plan, layout, rope, a, saved.keys.data(), saved.cmp);
  saved.q.resize(size_t(N * nI * cI));
  saved.w.resize(size_t(N * nI));
  saved.score.assign(size_t(N * k_sel), T(0));
  cpu::linear_fwd_t<T>(saved.q.data(), cq, p.wq_b, N, dims.d_c, nI * cI);
  cpu::linear_fwd_t<T>(saved.w.data(), a, p.weights_proj, N, dims.d, nI);
  const T wscale = T(1) / std::sqrt(T(nI));
  for (T& v : saved.w) v *= wscale;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t pos = layout.pos[size_t(i)];
    for (int64_t h = 0; h < nI; ++h)
      rope_rotate(saved.q.data() + (i * nI + h) * cI + cI - dims.rope_dim, rope.cos_at(pos), rope.sin_at(pos),
                  n_pairs, +1);
  }
  // Scores by blocks of queries of one row against all of that row's entries, one GEMM per head
  // (U = Q_h K^T), then I = sum_h w_h ReLU(U) / sqrt(c_I); only each query's visible range is used.
  const int64_t T_row = layout.T, q_block = 256;
  const T sscale = T(1) / std::sqrt(T(cI));
  std::vector<T> U, I;
  for (int64_t b = 0; b < layout.B; ++b) {
    const int64_t e0 = plan.row_entry_begin[size_t(b)], Eb = plan.row_entry_begin[size_t(b + 1)] - e0;
    for (int64_t t0 = 0; t0 < T_row; t0 += q_block) {
      const int64_t nq = std::min(q_block, T_row - t0), i0 = b * T_row + t0;
      I.assign(static_cast<size_t>(nq * Eb), T(0));
      U.resize(static_cast<size_t>(nq * Eb));
      for (int64_t h = 0; h < nI && Eb > 0; ++h) {
        cpu::gemm_ld<T>(U.data(), Eb, saved.q.data() + i0 * nI * cI + h * cI, nI * cI,
                        saved.keys.data() + e0 * cI, cI, nq, Eb, cI, false, true, T(1), T(0));
#pragma omp parallel for schedule(static) if (nq * Eb > kParallelWork)
        for (int64_t t = 0; t < nq; ++t) {
          const T w = saved.w[size_t((i0 + t) * nI + h)] * sscale;
          T* __restrict It = I.data() + t * Eb;
          const T* __restrict Ut = U.data() + t * Eb;
          for (int64_t e = 0; e < Eb; ++e) {
            const T u = Ut[e];
            It[e] += w * (u > T(0) ? u : T(0));  // branch-free so that it vectorises
          }
        }
      }
#pragma omp parallel if (nq * Eb > kParallelWork)
      {
        std::vector<int64_t> order;
#pragma omp for schedule(dynamic, 8)
        for (int64_t t = 0; t < nq; ++t) {
          const int64_t i = i0 + t;
          const int64_t vb = plan.vis_begin[size_t(i)], nv = plan.vis_end[size_t(i)] - vb;
          const T* sc = I.data() + t * Eb + (vb - e0);
          order.resize(static_cast<size_t>(nv));
          std::iota(order.begin(), order.end(), int64_t(0));
          const int64_t n_take = std::min(k_sel, nv);
          // Best score first; ties go to the earlier entry (the fixture has no near-ties, design README).
          std::partial_sort(order.begin(), order.begin() + n_take, order.end(),
                            [&](int64_t x, int64_t y) { return sc[x] > sc[y] || (sc[x] == sc[y] && x < y); });
          for (int64_t s = 0; s < k_sel; ++s) {
            const bool valid = s < n_take;
            sel[i * k_sel + s] = valid ? vb + order[size_t(s)] : -1;
            saved.score[size_t(i * k_sel + s)] = valid ? sc[order[size_t(s)]] : T(0);
          }
        }
      }
    }
  }
}

template <typename T>
void indexer_score_selected(const IndexerDims& dims, const IndexerSaved<T>& saved, int64_t N,
                            const int64_t* sel, std::vector<T>& score) {
  const int64_t nI = dims.n_heads, cI = dims.head_dim, k_sel = dims.k_sel;
  score.assign(size_t(N * k_sel), T(0));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t s = 0; s < k_sel; ++s) {
      const int64_t e = sel[i * k_sel + s];
      if (e >= 0)
        score[size_t(i * k_sel + s)] =
            score_of(dims, saved.q.data() + i * nI * cI, saved.w.data() + i * nI, saved.keys.data() + e * cI);
    }
}

template <typename T>
void indexer_backward(const IndexerParamsT<T>& p, const IndexerParamsT<T>& g, const IndexerDims& dims,
                      const CompressPlan& plan, const SeqLayout& layout, const RopeTable<T>& rope, const T* a,
                      const T* cq, const IndexerSaved<T>& saved, const int64_t* sel, const T* dscore) {
  const int64_t N = layout.n_tokens(), nI = dims.n_heads, cI = dims.head_dim, k_sel = dims.k_sel;
  const int64_t E = plan.n_entries, n_pairs = dims.rope_dim / 2;
  const T sscale = T(1) / std::sqrt(T(cI)), wscale = T(1) / std::sqrt(T(nI));
  std::vector<T> dq(size_t(N * nI * cI), T(0)), dw(size_t(N * nI), T(0)), dkeys(size_t(E * cI), T(0));
  const int n_threads = N * k_sel * nI * cI > kParallelWork ? omp_get_max_threads() : 1;
  const size_t nt = size_t(n_threads);
  std::vector<std::vector<T>> t_dkeys(nt);
#pragma omp parallel num_threads(n_threads)
  {
    std::vector<T>& my_dkeys = t_dkeys[size_t(omp_get_thread_num())];
    my_dkeys.assign(size_t(E * cI), T(0));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* q_t = saved.q.data() + i * nI * cI;
      const T* w_t = saved.w.data() + i * nI;
      T* dq_t = dq.data() + i * nI * cI;
      T* dw_t = dw.data() + i * nI;
      for (int64_t s = 0; s < k_sel; ++s) {
        const int64_t e = sel[i * k_sel + s];
        const T dI = dscore[i * k_sel + s];
        if (e < 0 || dI == T(0)) continue;
        const T* key = saved.keys.data() + e * cI;
        T* dkey = my_dkeys.data() + e * cI;
        for (int64_t h = 0; h < nI; ++h) {
          const T* qh = q_t + h * cI;
          T u = 0;
          for (int64_t k = 0; k < cI; ++k) u += qh[k] * key[k];
          if (u <= 0) continue;
          dw_t[h] += dI * u * sscale * wscale;  // d/d(a W_wp^T) of w = (a W_wp^T) * wscale
          const T du = dI * w_t[h] * sscale;
          for (int64_t k = 0; k < cI; ++k) {
            dq_t[h * cI + k] += du * key[k];
            dkey[k] += du * qh[k];
          }
        }
      }
    }
  }
  for (const auto& v : t_dkeys)
    for (size_t k = 0; k < v.size(); ++k) dkeys[k] += v[k];
  for (int64_t i = 0; i < N; ++i) {
    const int64_t pos = layout.pos[size_t(i)];
    for (int64_t h = 0; h < nI; ++h)
      rope_rotate(dq.data() + (i * nI + h) * cI + cI - dims.rope_dim, rope.cos_at(pos), rope.sin_at(pos),
                  n_pairs, -1);
  }
  cpu::linear_bwd_t<T>(nullptr, g.wq_b, dq.data(), cq, p.wq_b, N, dims.d_c, nI * cI);
  cpu::linear_bwd_t<T>(nullptr, g.weights_proj, dw.data(), a, p.weights_proj, N, dims.d, nI);
  CompressorDims cd{dims.d, cI, dims.rope_dim, true, dims.eps};
  compressor_backward(p.compressor, g.compressor, cd, plan, layout, rope, a, saved.cmp, dkeys.data(),
                      static_cast<T*>(nullptr));
}

#define TREX_INSTANTIATE(T)                                                                                 \
  template void indexer_forward<T>(const IndexerParamsT<T>&, const IndexerDims&, const CompressPlan&,       \
                                   const SeqLayout&, const RopeTable<T>&, const T*, const T*, int64_t*,     \
                                   IndexerSaved<T>&);                                                       \
  template void indexer_score_selected<T>(const IndexerDims&, const IndexerSaved<T>&, int64_t,              \
                                          const int64_t*, std::vector<T>&);                                 \
  template void indexer_backward<T>(const IndexerParamsT<T>&, const IndexerParamsT<T>&, const IndexerDims&, \
                                    const CompressPlan&, const SeqLayout&, const RopeTable<T>&, const T*,   \
                                    const T*, const IndexerSaved<T>&, const int64_t*, const T*);
TREX_INSTANTIATE(float)
TREX_INSTANTIATE(double)
#undef TREX_INSTANTIATE

}  // namespace trex::dsv4
