// Cross-entropy fused with the LM head, in vocabulary chunks (design §2.10): the [n, vocab] logits are never
// materialised. Forward: per chunk one cuBLASLt GEMM (bf16 in, fp32 logits [n, chunk]) then a kernel updating
// each row's running max / sum-exp and picking up its target logit. Backward: per chunk the logits are
// recomputed, dlogits = scale * (softmax - onehot) (bf16), then dHidden += dlogits W_chunk and
// dW_chunk += dlogits^T hidden (fp32 accumulation). Rows with target < 0 are ignored (no loss, no gradient),
// as in trex::cpu::cross_entropy_*.
// Training (lm_head_ce_fwd_grad): the loss and its gradient in one pass, with no recompute: the softmax gradient
// of a row needs the row's log-sum-exp over the WHOLE vocabulary, so this pass is chunked by rows instead: per
// block of `rows` rows one GEMM gives their full-vocabulary fp32 logits (a bounded buffer [rows, vocab]), a
// kernel turns them into lse, row loss and bf16 dlogits, then dHidden_rows = dlogits W; the bf16 dlogits of a
// group of `grad_rows` rows are kept for one dW += dlogits^T hidden_group (K = grad_rows: fewer passes over the
// fp32 [vocab, d] dW). Three vocabulary-sized GEMMs instead of the four of fwd + bwd; the [n, vocab] logits are
// still never materialised.
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
  int64_t chunk = 0;  // vocabulary columns per GEMM (lm_head_ce_fwd / _bwd)
  int64_t rows = 0;       // rows per logits block of lm_head_ce_fwd_grad (0: not used)
  int64_t grad_rows = 0;  // rows per dW GEMM of lm_head_ce_fwd_grad (0: rows; at least rows)
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

// Device scratch of lm_head_ce_fwd_grad, in bytes: fp32 logits of one row block [min(rows, n), vocab] and bf16
// dlogits of one dW group [min(max(grad_rows, rows), n), vocab]: about (4 rows + 2 grad_rows) * vocab bytes
// (1.6 GB at rows 1024, grad_rows 4096, vocab 129280).
size_t lm_head_ce_fwd_grad_scratch_bytes(const LmHeadCeShape& s);

// The forward of a training step with the gradient of scale * sum of row_loss formed on the way: writes lse,
// row_loss, loss_sum as lm_head_ce_fwd (loss_sum may be null), WRITES dhidden [n, d] (fp32; zero rows for
// ignored targets) and ACCUMULATES dw_head [vocab, d] (fp32). Uses s.rows (> 0) and s.grad_rows, not s.chunk.
void lm_head_ce_fwd_grad(Gemm& gemm, const LmHeadCeShape& s, const bf16* hidden, const bf16* w_head,
                         const int32_t* targets, float scale, float* lse, float* row_loss, float* loss_sum,
                         float* dhidden, float* dw_head, void* scratch, cudaStream_t stream = nullptr);

}  // namespace trex::cuda
