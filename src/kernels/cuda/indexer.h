// Lightning-indexer scoring and top-k selection on the GPU (design §2.7), mirroring trex::dsv4::indexer_forward's
// selection: score(t, s) = sum_h w[t,h] * ReLU(q[t,h] . K[s]) / sqrt(c_I) over the entries s in
// [vis_begin[t], vis_end[t]); the min(k_sel, #visible) best (ties: the lower entry) are written best first, the
// remaining slots -1. One block per query, no [N, E] score matrix. n_I from 1 to 64 (4, 8, 16, 32, 64 natively, others
// padded with zero heads), c_I a multiple of 8. bf16 q / keys, fp32 head weights and scores. Scores run on tensor cores (bf16 mma, fp32 accumulate) when
// n_I is 16, 32 or 64 and c_I is 64 or 128, else (or with IndexerKernel::CudaCore) on CUDA cores in fp32; the two
// sum in different orders, so near-ties may select differently.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

enum class IndexerKernel { Auto, CudaCore };

struct IndexerTopkArgs {
  int64_t n_tok = 0, n_heads = 0, head_dim = 0, k_sel = 0;
  int64_t max_visible = 0;            // upper bound of vis_end - vis_begin over the queries (sizes shared memory)
  float w_scale = 1.f;                // multiplies w (1/sqrt(n_I) when w is the raw weights_proj output)
  const int64_t* vis_begin = nullptr;  // [N] global entry range each query may see
  const int64_t* vis_end = nullptr;
};

// q [N, n_I, c_I] (RoPE applied), w [N, n_I] fp32, keys [E, c_I] -> sel [N, k_sel] global entry indices.
void indexer_topk(int64_t* sel, const bf16* q, const float* w, const bf16* keys, const IndexerTopkArgs& a,
                  cudaStream_t s = nullptr, IndexerKernel kernel = IndexerKernel::Auto);

}  // namespace trex::cuda
