// The key set of one query of the sparse attention (device side of SparseKeySets, attention_sparse.h): window rows
// [win_begin, i] of the step's kv, then n_cmp compressed slots (CSA: the query's selection row, -1 = empty; HCA: a
// dense entry range), in the CPU path's order. Shared by the CUDA-core and tensor-core kernels.
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

}  // namespace trex::cuda::attn_keys
