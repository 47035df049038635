// Generic sparse multi-query attention with a per-head sink: any head dim, any head count. The fallback for
// the shapes the fast kernels (attention_sparse.h: head dim 256 / 512 only) do not serve, e.g. the golden
// fixtures' head dims 16 / 32 / 48 in `trex parity --device cuda`. Same contract as
// cuda::sparse_attention_fwd / _bwd (the same key sets, key order, sink and lse meaning; mirrors
// src/kernels/cpu/attention_sparse.h). Simple on purpose: one block per (query, head), keys visited one at a
// time with block-wide fp32 dot products and an online softmax; fp32 accumulation throughout. Speed is not a
// goal (fixture-sized models only).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_sparse.h"

namespace trex::cuda {

// Head dims the fast kernels of attention_sparse.h serve; everything else goes to the generic kernels below.
inline bool sparse_attention_fast_head_dim(int64_t c) {
  return c == 256 || c == 512;
}

// q [N, H, c], kv [N, c], cmp [E, c], sink [H]  ->  o [N, H, c] (bf16), lse [N, H] (fp32, with the sink).
void sparse_attention_generic_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink,
                                  int64_t N, int64_t H, int64_t c, const SparseKeySets& keys, bf16* o,
                                  float* lse, cudaStream_t s = nullptr);

// fp32 elements of scratch sparse_attention_generic_bwd needs: one sink partial per (query, head), the inverse
// index and one chunk's dK + dV partials (attention_dkv_reduce.h; keys: only which kind, k_sel and max_win are read).
int64_t sparse_attention_generic_bwd_scratch(int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys);

// Writes dq [N, H, c] (bf16). ACCUMULATES dkv [N, c] and dcmp [E, c] (dcmp may be null when E = 0) and dsink [H].
// Bitwise deterministic: each (query, head) block writes its dK + dV per key slot and every key row sums them in a
// fixed order (attention_dkv_reduce.h); the sink partials are summed in a fixed order too.
void sparse_attention_generic_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink,
                                  int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys,
                                  const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                                  float* dcmp, float* dsink, float* scratch, cudaStream_t s = nullptr);

}  // namespace trex::cuda
