// Sparse multi-query attention with a per-head sink (DeepSeek-V4 core attention, design §2.4.3).
// One shared K=V vector per key. Query i of head h attends to
//   - its raw window: kv rows [win_begin[i], i] (global token indices, same row), and
//   - compressed entries: either the dense range [cmp_begin[i], cmp_end[i]) (HCA) or, when cmp_sel is
//     given, the k_sel slots cmp_sel[i*k_sel ..] (global entry indices, -1 = empty slot) (CSA),
// with softmax denominator sum_j exp(z_j) + exp(sink[h]), z_j = q.k_j / sqrt(c).
// Work is O(N * H * (window + compressed keys) * c); no N x N matrix is ever formed.
#pragma once
#include <cstdint>

namespace trex::cpu {

struct SparseKeySets {
  const int64_t* win_begin = nullptr;  // [N]
  const int64_t* cmp_begin = nullptr;  // [N] (dense range; may be null when there are no compressed keys)
  const int64_t* cmp_end = nullptr;    // [N]
  const int64_t* cmp_sel = nullptr;    // [N, k_sel] (selected entries; overrides the range when non-null)
  int64_t k_sel = 0;
};

// q [N, H, c], kv [N, c], cmp [E, c], sink [H]  ->  o [N, H, c] (before the inverse RoPE),
// lse [N, H] = log(denominator including the sink), kept for backward.
template <typename T>
void sparse_attention_fwd(const T* q, const T* kv, const T* cmp, const T* sink, int64_t N, int64_t H,
                          int64_t c, const SparseKeySets& keys, T* o, T* lse);

// do_ [N, H, c] = dL/do. Writes dq [N, H, c] (overwrite); accumulates dkv [N, c], dcmp [E, c] (may be
// null when E = 0) and dsink [H]. Uses per-thread accumulators reduced in a fixed order, so results
// are deterministic for a given thread count.
template <typename T>
void sparse_attention_bwd(const T* q, const T* kv, const T* cmp, const T* sink, int64_t N, int64_t E,
                          int64_t H, int64_t c, const SparseKeySets& keys, const T* o, const T* lse,
                          const T* do_, T* dq, T* dkv, T* dcmp, T* dsink);

// Attention probabilities of query i, head h over its selected compressed slots (0 for empty slots):
// p [k_sel]. Used by the indexer's KL training signal.
template <typename T>
void sparse_attention_selected_probs(const T* q, const T* cmp, int64_t H, int64_t c,
                                     const SparseKeySets& keys, const T* lse, int64_t i, int64_t h, T* p);

}  // namespace trex::cpu
