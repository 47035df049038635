// Cross-entropy fused with the LM head, in vocabulary chunks (design §2.10): the [n, vocab] logits are never
// materialised. Forward: per chunk one cuBLASLt GEMM (bf16 in, fp32 logits [n, chunk]) then a kernel updating
// each row's running max / sum-exp and picking up its target logit. Backward: per chunk the logits are
// recomputed, dlogits = scale * (softmax - onehot) (bf16), then dHidden += dlogits W_chunk and
// dW_chunk += dlogits^T hidden (fp32 accumulation). Rows with target < 0 are ignored (no loss, no gradient),
// as in trex::cpu::cross_entropy_*.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm.h"

namespace trex::cuda {

using bf16 = __nv_bfloat16;

struct LmHeadCeShape {
  int64_t n = 0;      // rows (tokens)
  int64_t d = 0;      // hidden size
  int64_t vocab = 0;  // head rows
  int64_t chunk = 0;  // vocabulary columns per GEMM
};

// Device scratch the two passes need, in bytes: fp32 logits [n, chunk], bf16 dlogits [n, chunk], and three
// fp32 [n] row states.
size_t lm_head_ce_scratch_bytes(const LmHeadCeShape& s);

// hidden [n, d], w_head [vocab, d] (bf16), targets [n] (int32, < 0 = ignored). Writes lse [n] (fp32) and
// row_loss [n] (fp32: lse - logit[target], 0 for ignored rows) and loss_sum [1] = sum of row_loss (fp32,
// fixed-order reduction).
void lm_head_ce_fwd(Gemm& gemm, const LmHeadCeShape& s, const bf16* hidden, const bf16* w_head,
                    const int32_t* targets, float* lse, float* row_loss, float* loss_sum, void* scratch,
                    cudaStream_t stream = nullptr);

// d(scale * sum of row_loss): ACCUMULATES dhidden [n, d] and dw_head [vocab, d] (both fp32).
void lm_head_ce_bwd(Gemm& gemm, const LmHeadCeShape& s, const bf16* hidden, const bf16* w_head,
                    const int32_t* targets, const float* lse, float scale, float* dhidden, float* dw_head,
                    void* scratch, cudaStream_t stream = nullptr);

}  // namespace trex::cuda
