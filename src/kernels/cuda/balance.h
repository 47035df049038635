// The sequence-wise balance loss on the GPU (design §5, DeepSeek-V3 definition; the CPU reference is
// trex::dsv4::balance_loss, src/model/dsv4/balance.h), per MoE layer and batch row b of T tokens:
//   f_e = E / (K T) #{t : e selected at t},   P_e = (1/T) sum_t s_te / sum_e' s_te',   L_b = alpha sum_e f_e P_e,
// the layer's loss (1/B) sum_b L_b. The counts are constants (selection is not differentiable); the gradient flows
// to the router scores: dscores_te = (c_e - sum_e' c_e' s_te' / S_t) / S_t with c_e = alpha f_e / (B T), S_t = sum_e s_te.
// Every sum runs in fp64 in a fixed order (deterministic). Raw pointers, plain ints; stream-ordered.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

// fp64 elements of scratch balance_loss needs.
int64_t balance_loss_scratch(int64_t B, int64_t T, int64_t E);

// scores [B*T, E] fp32 (positive router scores), sel [B*T, K] expert ids -> row_loss [B] fp64 (alpha L_b / B, so
// the layer's loss is their sum) and dscores [B*T, E] fp32 (written; d(layer loss)/d(scores)).
void balance_loss(const float* scores, const int32_t* sel, int64_t B, int64_t T, int64_t E, int64_t K, double alpha,
                  double* row_loss, float* dscores, double* scratch, cudaStream_t s = nullptr);

}  // namespace trex::cuda
