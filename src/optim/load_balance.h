// MoE load balancing of DeepSeek-V3/V4 (design §5): the auxiliary-loss-free router-bias update and the
// sequence-wise balance loss. Raw pointers; the model calls the loss, the trainer calls the bias update.
#pragma once
#include <cstdint>

namespace trex::optim {

// b_e <- b_e + speed * sign(mean_load - load_e): lowers the bias of overloaded experts, raises it for
// underloaded ones; experts exactly at the mean are unchanged. `load` counts tokens routed to each expert.
void update_router_bias(float* bias, const float* load, int64_t n_experts, double speed);

// L_bal = alpha * sum_e f_e P_e for one sequence of T tokens, with f_e = E / (K T) * #{t : e in sel_t} and
// P_e = (1/T) sum_t s_{e,t} / sum_{e'} s_{e',t}. scores: [T, E] router scores without bias; sel: [T, K].
// When grad_scores is non-null, dL/ds is ADDED to it ([T, E]; f is treated as a constant).
double seq_balance_loss(const float* scores, const int32_t* sel, int64_t T, int64_t E, int64_t K, double alpha,
                        float* grad_scores);

}  // namespace trex::optim
