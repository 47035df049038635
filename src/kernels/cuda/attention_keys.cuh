// The key set of one query of the sparse attention (device side of SparseKeySets, attention_sparse.h): window rows
// [win_begin, i] of the step's kv, then n_cmp compressed slots (CSA: the query's selection row, -1 = empty; HCA: a
// dense entry range), in the CPU path's order; and the union of consecutive queries' lists (multi-query blocks).
// Shared by the CUDA-core and tensor-core kernels and the deterministic dK + dV reduction (attention_dkv_reduce.h).
#pragma once
#include <cstdint>

#include "kernels/cuda/attention_sparse.h"

namespace trex::cuda::attn_keys {

struct KeyList {
  int64_t win_begin, n_win, n_cmp, cmp_begin;
  const int64_t* sel;
  __device__ int64_t size() const { return n_win + n_cmp; }
};

__device__ inline KeyList key_list(const SparseKeySets& k, int64_t i) {
  KeyList l;
  l.win_begin = k.win_begin[i];
  l.n_win = i - l.win_begin + 1;
  l.sel = nullptr;
  l.cmp_begin = 0;
  l.n_cmp = 0;
  if (k.cmp_sel) {
    l.sel = k.cmp_sel + i * k.k_sel;
    l.n_cmp = k.k_sel;
  } else if (k.cmp_begin) {
    l.cmp_begin = k.cmp_begin[i];
    l.n_cmp = k.cmp_end[i] - l.cmp_begin;
  }
  return l;
}

// The union of the key lists of queries i0 .. i0 + nq - 1 (the multi-query blocks): window rows
// [win_begin[i0], i0 + nq - 1], then the compressed slots of all nq queries (CSA: their selections back to back,
// [N, k_sel] is contiguous; HCA: the smallest range covering theirs). Each query masks the keys not its own.
__device__ inline KeyList union_key_list(const SparseKeySets& k, int64_t i0, int nq) {
  KeyList l = key_list(k, i0);
  const int64_t i1 = i0 + nq - 1;
  for (int64_t i = i0 + 1; i <= i1; ++i) l.win_begin = min(l.win_begin, k.win_begin[i]);
  l.n_win = i1 - l.win_begin + 1;
  if (k.cmp_sel) {
    l.n_cmp = nq * k.k_sel;
  } else if (k.cmp_begin) {
    int64_t b = k.cmp_begin[i0], e = k.cmp_end[i0];
    for (int64_t i = i0 + 1; i <= i1; ++i) b = min(b, k.cmp_begin[i]), e = max(e, k.cmp_end[i]);
    l.cmp_begin = b;
    l.n_cmp = max(e - b, int64_t(0));
  }
  return l;
}

}  // namespace trex::cuda::attn_keys
