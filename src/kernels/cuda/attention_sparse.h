// GPU sparse multi-query attention with a per-head sink (design §2.4.3), flash-style (no N x N matrix):
// a running max / sum-exp per (query, head). Mirrors src/kernels/cpu/attention_sparse.h exactly (same key
// order: window rows first, then compressed slots; -1 slots are empty; the sink adds exp(sink[h]) to the
// denominator). bf16 q / kv / cmp, fp32 sink, lse and accumulation. One block serves kSparseAttnHeadsPerBlock
// heads of one query, so every key row it loads is reused by all those heads. Head dim c must be 256 or 512
// (V4: 512). Two implementations: TensorCore (attention_sparse_mma.cu, the default: heads as the M dimension of
// bf16 tensor-core products -- sm_90a wgmma for the forward when H > 32, split-dims mma.sync kernels for H <= 32,
// the kernel per shape chosen in attention_sparse_mma.cu) and CudaCore (this file's fp32 kernels, kept as the
// reference the benchmark in dev/attention/ compares against).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

constexpr int kSparseAttnHeadsPerBlock = 16;

// Which implementation serves a call: Auto = TensorCore (every supported c); CudaCore = the fp32 kernels.
enum class SparseAttnKernel { Auto, CudaCore, TensorCore };

// Device pointers; the same meaning as trex::cpu::SparseKeySets.
struct SparseKeySets {
  const int64_t* win_begin = nullptr;  // [N]: window = kv rows [win_begin[i], i]
  const int64_t* cmp_begin = nullptr;  // [N] dense compressed range (HCA); null when there are none
  const int64_t* cmp_end = nullptr;    // [N]
  const int64_t* cmp_sel = nullptr;    // [N, k_sel] selected entries (CSA), -1 = empty; overrides the range
  int64_t k_sel = 0;
  // Host side, for the backward only: the most window rows any query has (the sliding window length); the
  // backward sizes its per-key-slot scratch from it (and stops with a message naming the queries if a window is
  // longer).
  int64_t max_win = 0;
};

// q [N, H, c], kv [N, c], cmp [E, c], sink [H]  ->  o [N, H, c] (bf16, before the inverse RoPE),
// lse [N, H] (fp32, log of the denominator including the sink).
void sparse_attention_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N,
                          int64_t H, int64_t c, const SparseKeySets& keys, bf16* o, float* lse,
                          cudaStream_t s = nullptr, SparseAttnKernel kernel = SparseAttnKernel::Auto);

// fp32 elements of scratch sparse_attention_bwd needs for these shapes and key kinds (keys: only which kind,
// k_sel and max_win are read): the sink partials, the inverse index and one chunk's dK + dV partials
// (attention_dkv_reduce.h).
// partial_budget: bytes of dK + dV partials one chunk of queries may hold (the backward runs its queries in chunks
// of that size); the same value must reach sparse_attention_bwd. Results are bitwise reproducible for a given
// budget, shape and GPU model.
constexpr int64_t kSparseAttnPartialBudget = int64_t(1) << 30;
// How the backward sums the dK + dV contributions of the queries that share a key row. Deterministic: per-slot
// partials reduced in a fixed order (bitwise reproducible; about 1.5-3.8x the kernel time, the partials' HBM
// traffic). Atomic: 16-byte fp32 atomic adds (the fast path; last-bit differences from run to run). The CUDA-core
// kernel (SparseAttnKernel::CudaCore, head dims without tensor-core kernels) is always deterministic.
enum class SparseAttnBwdOrder { Deterministic, Atomic };
int64_t sparse_attention_bwd_scratch(int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys,
                                     SparseAttnKernel kernel = SparseAttnKernel::Auto,
                                     int64_t partial_budget = kSparseAttnPartialBudget,
                                     SparseAttnBwdOrder order = SparseAttnBwdOrder::Deterministic);

// do_ [N, H, c]. Writes dq [N, H, c] (bf16). ACCUMULATES dkv [N, c], dcmp [E, c] (fp32; dcmp may be null when
// E = 0) and dsink [H] (fp32). Deterministic order: each block writes the dK + dV of its key slots (summed over
// its heads) to the scratch and every key row sums them in a fixed order (attention_dkv_reduce.h), no atomics;
// Atomic order: the same kernels add them with fp32 atomics. dsink is summed in a fixed order either way.
// K = V: each key row gets dK + dV.
void sparse_attention_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N,
                          int64_t E, int64_t H, int64_t c, const SparseKeySets& keys, const bf16* o,
                          const float* lse, const bf16* do_, bf16* dq, float* dkv, float* dcmp, float* dsink,
                          float* scratch, cudaStream_t s = nullptr,
                          SparseAttnKernel kernel = SparseAttnKernel::Auto,
                          int64_t partial_budget = kSparseAttnPartialBudget,
                          SparseAttnBwdOrder order = SparseAttnBwdOrder::Deterministic);

}  // namespace trex::cuda
