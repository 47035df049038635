// Mixture-of-experts FFN (design §2.9): fp32 router with sqrt(softplus) scores, hash routing (tid2eid) or
// bias-corrected top-k selection, top-k normalisation and routed scaling, clamped SwiGLU experts, one shared
// expert. Forward and hand-written backward on raw pointers, float or double.
//
// The layer is split into router / routed experts / combine around an ExpertExchange (expert_exchange.h):
// the router and the gate weighting run on the token's rank, the experts run wherever the exchange puts
// them and return UNWEIGHTED outputs per (token, slot): out_t = sum_k g_k (h_k W2) = sum_k (g_k h_k) W2, so
// the gate gradient is dg_k = <dout_t, y_{t,k}>. The same code path serves one process (LocalExpertExchange,
// the default) and expert parallelism (parallel/ep_exchange.h).
#pragma once
#include <cstdint>
#include <vector>

#include "model/dsv4/expert_exchange.h"

namespace trex::dsv4 {

struct MoeShape {
  int64_t n_tok = 0;         // N tokens (B*S)
  int64_t d = 0;             // hidden
  int64_t n_experts = 0;     // E
  int64_t topk = 0;          // K
  int64_t inter = 0;         // f: routed expert width
  int64_t shared_inter = 0;  // shared expert width (f * n_shared_experts); 0 = none
  double routed_scale = 1.0;
  double swiglu_limit = 0.0;  // <= 0: no clamp
  bool hash = false;          // selection by tid2eid[token] instead of top-k of (score + bias)
};

// Weights: gate [E, d] (every expert, on every rank); experts w1/w3 [El, f, d], w2 [El, d, f] of the El experts the
// exchange holds, starting at its expert_begin (all E without expert parallelism), expert-major, contiguous; shared
// sw1/sw3 [fs, d], sw2 [d, fs]. Non-trainable: bias [E] (score layers), tid2eid [vocab, K] (hash layers).
template <class T>
struct MoeWeights {
  const T* gate = nullptr;
  const T* w1 = nullptr;
  const T* w3 = nullptr;
  const T* w2 = nullptr;
  const T* sw1 = nullptr;
  const T* sw3 = nullptr;
  const T* sw2 = nullptr;
  const float* bias = nullptr;
  const int32_t* tid2eid = nullptr;
  int64_t vocab = 0;  // rows of tid2eid, for range checks
};
template <class T>
struct MoeGrads {  // accumulated; any may be null
  T* gate = nullptr;
  T* w1 = nullptr;
  T* w3 = nullptr;
  T* w2 = nullptr;
  T* sw1 = nullptr;
  T* sw3 = nullptr;
  T* sw2 = nullptr;
};

// What the forward keeps for the backward. The token side is sized by moe_act_sizes and carved from caller
// buffers; order/offsets give this rank's slots in expert-sorted order (slot r = order[r] is the flat
// token*K + k index; offsets[e]..offsets[e+1] are expert e's slots) for the load statistics and GPU parity.
// The expert side (rows this process's experts received) changes size with the routing under expert
// parallelism, so it lives in vectors resized by the forward.
template <class T>
struct MoeActs {
  T* logits = nullptr;     // [N, E]
  T* scores = nullptr;     // [N, E] sqrt(softplus(logits))
  int32_t* sel = nullptr;  // [N, K] selected experts
  T* weight = nullptr;     // [N, K] routed gate weights g_k (rho * s / sum s)
  int32_t* order = nullptr;    // [N*K]
  int32_t* offsets = nullptr;  // [E+1]
  T* y_slots = nullptr;    // [N*K, d] unweighted expert output of each (token, slot)
  T* sh_gate = nullptr;    // [N, fs]
  T* sh_up = nullptr;      // [N, fs]
  // Expert side: R received rows grouped by local expert (counts[j] rows for expert expert_begin + j).
  std::vector<int64_t> counts;
  std::vector<T> x_rows;    // [R, d]
  std::vector<T> gate_pre;  // [R, f]
  std::vector<T> up_pre;    // [R, f]
};

struct MoeActSizes {  // element counts
  int64_t t_elems = 0;    // scalar (T) elements in total
  int64_t i32_elems = 0;  // int32 elements in total
};
MoeActSizes moe_act_sizes(const MoeShape& s);
// Carves MoeActs out of two caller buffers of the sizes above.
template <class T>
MoeActs<T> moe_acts_bind(const MoeShape& s, T* tbuf, int32_t* ibuf);

// out[N, d] (written) = sum_k g_k expert_{e_k}(u) + shared(u). token_ids needed for hash layers.
// ex: where the experts are (null: all in this process); the plan stays under `key` for the backward.
// The shared expert runs while the dispatched rows are in flight.
template <class T>
void moe_fwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const int32_t* token_ids, MoeActs<T>& a, T* out,
             ExpertExchange<T>* ex = nullptr, const ExchangeKey& key = {});

// du[N, d] += d/du; grads accumulated. dscores_extra [N, E] (nullable): an extra gradient on the router scores
// (the balance loss), added before the score derivative. ex/key: those of the forward (the handle is released
// at the end); the router and shared-expert backward run while the output gradients are in flight.
template <class T>
void moe_bwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const MoeActs<T>& a, const T* dout,
             const T* dscores_extra, T* du, MoeGrads<T>& g, ExpertExchange<T>* ex = nullptr,
             const ExchangeKey& key = {});

// Per-expert selection counts over the N tokens (for the aux-loss-free bias update), written to load[E].
void moe_expert_load(const int32_t* sel, int64_t n_tok, int64_t topk, int64_t n_experts, int64_t* load);

// The aux-loss-free bias update rule (design §5): b_e += rate * sign(mean load - load_e). Hash layers have none.
void router_bias_update(float* bias, const int64_t* load, int64_t n_experts, double rate);

}  // namespace trex::dsv4
