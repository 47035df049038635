// The measured alternatives of the tensor-core sparse MQA kernels (dev/attention/README.md numbers them), for
// attention_bench.cu only: the product (src/kernels/cuda/attention_sparse_mma.cu) runs one configuration per
// shape; these are the other tilings, built from the same templates (src/kernels/cuda/attention_sparse_mma.cuh)
// plus the mma.sync forward kernel that only they use.
#pragma once
#include "kernels/cuda/attention_sparse.h"

namespace trex::cuda::mma_attn::variants {

// Forward tilings: Keys32 = 32-key tiles, 2 warps per 16 heads (v2); Keys64 = 64-key tiles (v3); Keys64Warps4 =
// 64-key tiles, 4 warps per 16 heads (twice the warps, half the output dims each; v4); MultiQuery = Keys32 with 64
// rows made of floor(64 / H) consecutive queries x H heads over the union of their keys (H <= 32, else Keys32;
// v5). SplitDims = one query x up to 64 heads (16 / 32 / 64 per block by H), 4 warps per 16 heads each owning
// c / 4 dims, S partials summed through shared memory, P in registers (v6; the product's kernel for H <= 32);
// SplitDims32 = the same with at most 32 heads per block (v7). *Prefetch: the same kernels with each tile's key
// sources loaded two tiles ahead into registers (v8 = v4, v9 = v5, v10 = v3). Wgmma: sm_90a warpgroup MMA, one
// query x 64 heads, two warpgroups of c / 2 output dims (v11; the product's kernel for H > 32; smaller H pads the
// 64 rows); WgmmaSplitS: S = Q K^T split over the two warpgroups by dims, partials summed in shared memory (v12).
enum class FwdTiling {
  Keys32, Keys64, Keys64Warps4, MultiQuery, SplitDims, SplitDims32, Keys64Warps4Prefetch, MultiQueryPrefetch,
  Keys64Prefetch, Wgmma, WgmmaSplitS
};
void fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s, FwdTiling tiling);

// Backward tilings (outputs as trex::cuda::mma_attn::bwd): Keys32 = one query x up to 64 heads, 32-key tiles
// (v2); MultiQuery = blocks of floor(64 / H) queries over the union of their keys (H <= 32; else Keys32; v5);
// SplitDims = one query x 16 heads per block, 4 warps each owning c / 4 dims (v6); SplitDims32 = 32 heads per
// block when H > 16 (8 warps; P, dS through shared memory for the sum over the heads; v7); Keys32Prefetch (v8),
// MultiQueryPrefetch (v9) = v2, v5 with key sources prefetched two tiles ahead. The product runs v8 for H > 32,
// v6 for CSA and v9 for window / HCA keys when H <= 32, deterministically (each block stores its dK + dV rows, a
// fixed-order reduction sums them: attention_dkv_reduce.h). Every tiling here adds dK + dV to dkv / dcmp with fp32
// atomics instead (run-to-run rounding differences); AtomicProd (v13) = the product's dispatch that way, the
// product's backward before it became deterministic.
enum class BwdTiling { Keys32, MultiQuery, SplitDims, Keys32Prefetch, MultiQueryPrefetch, SplitDims32, AtomicProd };
void bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
         float* dcmp, float* dsink_part, cudaStream_t s, BwdTiling tiling);

}  // namespace trex::cuda::mma_attn::variants
