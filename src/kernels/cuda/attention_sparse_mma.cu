// The tensor-core sparse MQA configurations the product runs (attention_sparse_mma.h), chosen per shape from the
// measurements in dev/attention/README.md (H200, c = 512; the alternatives are numbered versions there, built from
// the same templates in attention_sparse_mma.cuh by dev/attention/sparse_variants.cu).
#include "kernels/cuda/attention_sparse_mma.h"

#include "kernels/cuda/attention_sparse_mma.cuh"

namespace trex::cuda::mma_attn {
namespace {

// Forward for H > 32 (dev v11): the wgmma kernel (64 heads = one M tile, two warpgroups) wins every key kind at
// flash-l4's 64 heads (CSA 6.2 -> 2.9 ms, sliding 1.29 -> 0.90, HCA 1.65 -> 1.12 against the mma.sync blocks).
// For H <= 32 (dev v6): the split-dims kernel (one query x 16 heads, 4 warps splitting c, P in registers, 3 blocks
// per SM) wins every key kind at small-s6's 16 heads (CSA 2.9 -> 0.77 ms, sliding 0.22 -> 0.19, HCA 0.24 -> 0.23).
template <int C>
void fwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
           const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  if (H > 32) return launch_wg_fwd<C, false>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  if (H > 16) return launch_sd_fwd<C, 2>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  return launch_sd_fwd<C, 1>(q, kv, cmp, sink, N, H, keys, o, lse, s);
}

// Backward for H > 32 (dev v8): one query x 64 heads (dK + dV summed over all of them in the block) with
// prefetched key sources (CSA 12.5 -> 10.0 ms, sliding 3.23 -> 3.04, HCA 3.80 -> 3.63 with atomics). H <= 32: CSA by
// the split-dims kernel (dev v6: 16 heads per block, dQ and the dK + dV transposes in registers; 5.9 -> 2.4 ms);
// window / HCA keys by the multi-query blocks with prefetched sources (dev v9: 0.50 / 0.52 ms). All of them store
// their dK + dV rows for the fixed-order reduction (DET); bwd_atomic runs the same dispatch with atomics (dev v13),
// 2.7x (CSA), 1.5x (sliding) and 3.8x (HCA) faster at small-s6's shapes, since it skips the partials' traffic.
template <int C>
void bwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
           const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* part,
           const dkv_reduce::PartOut& po, int64_t n_units, cudaStream_t s) {
  if (H > 32)
    return launch_bwd<C, 4, false, true, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, nullptr, nullptr, part,
                                               s, po, n_units);
  if (keys.cmp_sel)
    return launch_sd_bwd<C, 1, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, nullptr, nullptr, part, s, po,
                                     n_units);
  return launch_bwd<C, 4, true, true, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, nullptr, nullptr, part, s,
                                            po, n_units);
}

template <int C>
void bwd_atomic_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                  const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                  float* dcmp, float* part, cudaStream_t s) {
  if (H > 32)
    return launch_bwd<C, 4, false, true, false>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
  if (keys.cmp_sel) return launch_sd_bwd<C, 1, false>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
  return launch_bwd<C, 4, true, true, false>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
}

}  // namespace

bool supported(int64_t c) {
  return c == 256 || c == 512;
}

void fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  if (c == 256) return fwd_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  return fwd_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, s);
}

BwdUnits bwd_units(int64_t H, const SparseKeySets& keys) {
  if (H > 32) return {1, (H + 63) / 64};
  if (keys.cmp_sel) return {1, (H + 15) / 16};
  return {64 / H, 1};  // launch_bwd<C, 4, true>: floor(16 MT / H) queries per block
}

void bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dsink_part,
         const dkv_reduce::PartOut& po, int64_t n_units, cudaStream_t s) {
  if (c == 256) return bwd_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dsink_part, po, n_units, s);
  return bwd_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dsink_part, po, n_units, s);
}

void bwd_atomic(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
                const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                float* dcmp, float* dsink_part, cudaStream_t s) {
  if (c == 256) return bwd_atomic_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  return bwd_atomic_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
}

}  // namespace trex::cuda::mma_attn
