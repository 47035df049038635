#include "kernels/cpu/attention_sparse.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace trex::cpu {
namespace {

constexpr int64_t kParallelWork = int64_t(1) << 17;  // smaller loops stay on one thread

// Rough operation count of a pass: every query reads its window and compressed keys for every head.
inline int64_t pass_work(const SparseKeySets& keys, int64_t N, int64_t H, int64_t c) {
  const int64_t per_query = (N > 0 ? N - keys.win_begin[N - 1] : 0) + 1 + keys.k_sel;
  return N * H * c * per_query;
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

// The keys of query i in a fixed order: window rows first, then compressed slots. key(j) returns the
// c-vector of key j; cmp_id(j) its compressed-entry index (-1 for window keys).
struct KeyList {
  int64_t win_begin = 0, n_win = 0;
  const int64_t* sel = nullptr;  // selected slots (may contain -1)
  int64_t cmp_begin = 0, n_cmp = 0;
  int64_t size() const { return n_win + n_cmp; }
};

inline KeyList key_list(const SparseKeySets& keys, int64_t i) {
  KeyList l;
  l.win_begin = keys.win_begin[i];
  l.n_win = i - l.win_begin + 1;
  if (keys.cmp_sel) {
    l.sel = keys.cmp_sel + i * keys.k_sel;
    l.n_cmp = keys.k_sel;
  } else if (keys.cmp_begin) {
    l.cmp_begin = keys.cmp_begin[i];
    l.n_cmp = keys.cmp_end[i] - keys.cmp_begin[i];
  }
  return l;
}

// Entry index of compressed key slot s (-1 = empty).
inline int64_t cmp_index(const KeyList& l, int64_t s) {
  return l.sel ? l.sel[s] : l.cmp_begin + s;
}

// z[j] for all keys of the list (-inf for empty slots); returns the max over z and the sink.
template <typename T>
T logits(const KeyList& l, const T* qh, const T* kv, const T* cmp, int64_t c, T scale, T sink, T* z) {
  T mx = sink;
  for (int64_t j = 0; j < l.n_win; ++j) {
    z[j] = dot(qh, kv + (l.win_begin + j) * c, c) * scale;
    mx = std::max(mx, z[j]);
  }
  for (int64_t s = 0; s < l.n_cmp; ++s) {
    const int64_t e = cmp_index(l, s);
    if (e < 0) {
      z[l.n_win + s] = -std::numeric_limits<T>::infinity();
      continue;
    }
    z[l.n_win + s] = dot(qh, cmp + e * c, c) * scale;
    mx = std::max(mx, z[l.n_win + s]);
  }
  return mx;
}

template <typename T>
inline const T* key_ptr(const KeyList& l, int64_t j, const T* kv, const T* cmp, int64_t c) {
  if (j < l.n_win) return kv + (l.win_begin + j) * c;
  const int64_t e = cmp_index(l, j - l.n_win);
  return e < 0 ? nullptr : cmp + e * c;
}

}  // namespace

template <typename T>
void sparse_attention_fwd(const T* q, const T* kv, const T* cmp, const T* sink, int64_t N, int64_t H,
                          int64_t c, const SparseKeySets& keys, T* o, T* lse) {
  const T scale = T(1) / std::sqrt(T(c));
#pragma omp parallel if (pass_work(keys, N, H, c) > kParallelWork)
  {
    std::vector<T> z;
#pragma omp for schedule(dynamic, 8)
    for (int64_t i = 0; i < N; ++i) {
      const KeyList l = key_list(keys, i);
      z.resize(size_t(l.size()));
      for (int64_t h = 0; h < H; ++h) {
        const T* qh = q + (i * H + h) * c;
        T* oh = o + (i * H + h) * c;
        const T mx = logits(l, qh, kv, cmp, c, scale, sink[h], z.data());
        T sum = std::exp(sink[h] - mx);
        for (int64_t j = 0; j < l.size(); ++j) {
          z[size_t(j)] = std::exp(z[size_t(j)] - mx);
          sum += z[size_t(j)];
        }
        for (int64_t k = 0; k < c; ++k) oh[k] = 0;
        for (int64_t j = 0; j < l.size(); ++j) {
          const T* kj = key_ptr(l, j, kv, cmp, c);
          if (!kj) continue;
          const T p = z[size_t(j)] / sum;
          for (int64_t k = 0; k < c; ++k) oh[k] += p * kj[k];
        }
        lse[i * H + h] = mx + std::log(sum);
      }
    }
  }
}

template <typename T>
void sparse_attention_bwd(const T* q, const T* kv, const T* cmp, const T* sink, int64_t N, int64_t E,
                          int64_t H, int64_t c, const SparseKeySets& keys, const T* o, const T* lse,
                          const T* do_, T* dq, T* dkv, T* dcmp, T* dsink) {
  const T scale = T(1) / std::sqrt(T(c));
  const int n_threads = pass_work(keys, N, H, c) > kParallelWork ? omp_get_max_threads() : 1;
  // Keys are shared between queries: each thread accumulates into its own copy, reduced below.
  const size_t nt = size_t(n_threads);
  std::vector<std::vector<T>> t_dkv(nt), t_dcmp(nt), t_dsink(nt);
#pragma omp parallel num_threads(n_threads)
  {
    const int tid = omp_get_thread_num();
    std::vector<T>& my_dkv = t_dkv[size_t(tid)];
    std::vector<T>& my_dcmp = t_dcmp[size_t(tid)];
    std::vector<T>& my_dsink = t_dsink[size_t(tid)];
    my_dkv.assign(size_t(N * c), T(0));
    my_dcmp.assign(size_t(E * c), T(0));
    my_dsink.assign(size_t(H), T(0));
    std::vector<T> z;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const KeyList l = key_list(keys, i);
      z.resize(size_t(l.size()));
      for (int64_t h = 0; h < H; ++h) {
        const T* qh = q + (i * H + h) * c;
        const T* oh = o + (i * H + h) * c;
        const T* doh = do_ + (i * H + h) * c;
        T* dqh = dq + (i * H + h) * c;
        const T L = lse[i * H + h];
        logits(l, qh, kv, cmp, c, scale, sink[h], z.data());
        const T D = dot(doh, oh, c);
        my_dsink[size_t(h)] -= std::exp(sink[h] - L) * D;
        for (int64_t k = 0; k < c; ++k) dqh[k] = 0;
        for (int64_t j = 0; j < l.size(); ++j) {
          const T* kj = key_ptr(l, j, kv, cmp, c);
          if (!kj) continue;
          const T p = std::exp(z[size_t(j)] - L);
          const T dz = p * (dot(doh, kj, c) - D) * scale;
          T* dk = j < l.n_win ? my_dkv.data() + (l.win_begin + j) * c
                              : my_dcmp.data() + cmp_index(l, j - l.n_win) * c;
          for (int64_t k = 0; k < c; ++k) {
            dqh[k] += dz * kj[k];
            dk[k] += dz * qh[k] + p * doh[k];
          }
        }
      }
    }
  }
  for (int t = 0; t < n_threads; ++t) {
    const std::vector<T>& a = t_dkv[size_t(t)];
    for (size_t k = 0; k < a.size(); ++k) dkv[k] += a[k];
    if (dcmp) {
      const std::vector<T>& b = t_dcmp[size_t(t)];
      for (size_t k = 0; k < b.size(); ++k) dcmp[k] += b[k];
    }
    for (int64_t h = 0; h < H; ++h) dsink[h] += t_dsink[size_t(t)][size_t(h)];
  }
}

template <typename T>
void sparse_attention_selected_probs(const T* q, const T* cmp, int64_t H, int64_t c,
                                     const SparseKeySets& keys, const T* lse, int64_t i, int64_t h, T* p) {
  const T scale = T(1) / std::sqrt(T(c));
  const T* qh = q + (i * H + h) * c;
  const T L = lse[i * H + h];
  for (int64_t s = 0; s < keys.k_sel; ++s) {
    const int64_t e = keys.cmp_sel[i * keys.k_sel + s];
    p[s] = e < 0 ? T(0) : std::exp(dot(qh, cmp + e * c, c) * scale - L);
  }
}

#define TREX_INSTANTIATE(T)                                                                                  \
  template void sparse_attention_fwd<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,   \
                                        const SparseKeySets&, T*, T*);                                       \
  template void sparse_attention_bwd<T>(const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t,   \
                                        int64_t, const SparseKeySets&, const T*, const T*, const T*, T*, T*, \
                                        T*, T*);                                                             \
  template void sparse_attention_selected_probs<T>(const T*, const T*, int64_t, int64_t,                     \
                                                   const SparseKeySets&, const T*, int64_t, int64_t, T*);
TREX_INSTANTIATE(float)
TREX_INSTANTIATE(double)
#undef TREX_INSTANTIATE

}  // namespace trex::cpu
