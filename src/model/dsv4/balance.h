// Sequence-wise balance loss (DeepSeek-V3 definition, design §5), per MoE layer, per row of the batch:
//   f_e = E / (K T) * #{t : e selected at t},  P_e = (1/T) sum_t s_{t,e} / sum_e' s_{t,e'},  L = alpha sum_e f_e P_e
// averaged over the B rows. The counts f are constants (selection is not differentiable); the gradient flows to
// the router scores s (and from there through the router like the gate weights do).
#pragma once
#include <cstdint>

namespace trex::dsv4 {

// Returns the loss; dscores[N, E] (written, nullable) = d(loss)/d(scores). scores [B*T, E], sel [B*T, K].
template <class T>
double balance_loss(const T* scores, const int32_t* sel, int64_t B, int64_t T_, int64_t E, int64_t K, double alpha,
                    T* dscores);

}  // namespace trex::dsv4
