// Tensor-core (mma.sync m16n8k16, bf16 in, fp32 accumulate) sparse MQA with sinks: the fast path behind
// trex::cuda::sparse_attention_{fwd,bwd} (attention_sparse.h has the contract). The heads of one query are the
// M dimension of every product (S = Q_i K_i^T, O = P V_i; K = V is the one shared head), so a block serves one
// query and up to 64 heads, staging 32-key tiles of its window rows and compressed entries in shared memory with
// cp.async (double buffered). Internal to attention_sparse.cu and the dev/attention benchmark.
#pragma once
#include "kernels/cuda/attention_sparse.h"

namespace trex::cuda::mma_attn {

// True when the tensor-core kernels serve this head dim (256 or 512).
bool supported(int64_t c);

// Forward tilings (the benchmark measures all): Keys32 = 32-key tiles, 2 warps per 16 heads (the default);
// Keys64 = 64-key tiles (fewer barriers, more shared memory); Keys64Warps4 = 64-key tiles, 4 warps per 16 heads
// (twice the warps, half the output dims each); MultiQuery = Keys32 with 64 rows made of floor(64 / H)
// consecutive queries x H heads over the union of their keys (H <= 32, e.g. small-s6's 16 heads; else Keys32).
// SplitDims = one query x up to 64 heads (16 / 32 / 64 per block by H), 4 warps per 16 heads each owning c / 4
// dims, S partials summed through shared memory, P in registers, 2 barriers per 32-key tile (H = 16: 3 blocks per
// SM); SplitDims32 = the same with at most 32 heads per block (H = 64: 2 blocks per query).
// *Prefetch: the same kernels with each tile's key sources loaded two tiles ahead into registers (the CSA
// selection's global loads no longer stall the cp.async issue). Wgmma: sm_90a warpgroup MMA, one query x 64 heads
// (M = 64), 64-key tiles, two warpgroups of c / 2 output dims (for H >= 64; smaller H pads the 64 rows);
// WgmmaSplitS: the same with S = Q K^T split over the two warpgroups by dims (partials summed in shared memory).
enum class FwdTiling {
  Keys32, Keys64, Keys64Warps4, MultiQuery, SplitDims, SplitDims32, Keys64Warps4Prefetch, MultiQueryPrefetch,
  Keys64Prefetch, Wgmma, WgmmaSplitS
};

void fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s, FwdTiling tiling = FwdTiling::Keys32);

// Same outputs as sparse_attention_bwd: dq written, dkv / dcmp accumulated with fp32 atomics (one per key row
// and 4 dims per block, summed over the block's heads first), dsink_part [N, H] written (reduced by the caller).
// Keys32: v2 (one query x up to 64 heads, 32-key tiles); MultiQuery: blocks of floor(64 / H) queries over the
// union of their keys, as FwdTiling::MultiQuery (H <= 32; else Keys32); SplitDims: one query x 16 heads per block
// (any H: ceil(H / 16) blocks per query), 4 warps each owning c / 4 dims, dK + dV summed over the block's 16 heads.
// SplitDims32: 32 heads per block when H > 16 (8 warps; P, dS through shared memory for the sum over the heads).
enum class BwdTiling { Keys32, MultiQuery, SplitDims, Keys32Prefetch, MultiQueryPrefetch, SplitDims32 };
void bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
         float* dcmp, float* dsink_part, cudaStream_t s, BwdTiling tiling = BwdTiling::Keys32);

}  // namespace trex::cuda::mma_attn
