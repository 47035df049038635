// Tensor-core (bf16 in, fp32 accumulate) sparse MQA with sinks: the fast path behind
// trex::cuda::sparse_attention_{fwd,bwd} (attention_sparse.h has the contract). The heads of one query are the
// M dimension of every product (S = Q_i K_i^T, O = P V_i; K = V is the one shared head). Each call picks the
// kernel for the shape (attention_sparse_mma.cu says which and why); the kernels are templates in
// attention_sparse_mma.cuh, whose other configurations dev/attention measures. Internal to attention_sparse.cu,
// its GPU test and the dev/attention benchmark.
#pragma once
#include "kernels/cuda/attention_dkv_reduce.h"
#include "kernels/cuda/attention_sparse.h"

namespace trex::cuda::mma_attn {

// True when the tensor-core kernels serve this head dim (256 or 512).
bool supported(int64_t c);

// Same outputs as sparse_attention_fwd. H > 32: sm_90a wgmma, one query x 64 heads per block (two warpgroups of
// c / 2 output dims; H not a multiple of 64 pads the last block). H <= 32: split dims, one query x 16 (H <= 16)
// or 32 heads per block, 4 warps per 16 heads each owning c / 4 dims.
void fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s);

// The units of bwd's kernel for this shape (attention_dkv_reduce.h): qb queries per unit, G blocks per unit.
struct BwdUnits {
  int64_t qb, G;
};
BwdUnits bwd_units(int64_t H, const SparseKeySets& keys);

// The units [po.u0, po.u0 + n_units) of sparse_attention_bwd: dq written, each block's dK + dV rows (summed over
// its heads) stored to po.part, dsink_part [N, H] written (reduced by the caller). H > 32: one query x 64 heads per
// block, 32-key tiles with key sources prefetched two tiles ahead. H <= 32 with CSA selections: split dims, one
// query x 16 heads per block (ceil(H / 16) blocks per query). H <= 32 with window / HCA keys: floor(64 / H)
// consecutive queries x H heads per block over the union of their keys, prefetched.
void bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dsink_part,
         const dkv_reduce::PartOut& po, int64_t n_units, cudaStream_t s);

// The same kernels over every query with 16-byte fp32 atomic adds into dkv / dcmp instead of the stored rows
// (SparseAttnBwdOrder::Atomic): no partials and no reduction pass, rounding order not reproducible.
void bwd_atomic(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
                const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                float* dcmp, float* dsink_part, cudaStream_t s);

}  // namespace trex::cuda::mma_attn
