// Mixture-of-experts FFN (design §2.9): fp32 router with sqrt(softplus) scores, hash routing (tid2eid) or
// bias-corrected top-k selection, top-k normalisation and routed scaling, clamped SwiGLU experts, one shared
// expert. Forward and hand-written backward on raw pointers, float or double.
#pragma once
#include <cstdint>
#include <vector>

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

// Weights: gate [E, d]; experts w1/w3 [E, f, d], w2 [E, d, f] (expert-major, contiguous); shared sw1/sw3 [fs, d],
// sw2 [d, fs]. Non-trainable: bias [E] (score layers), tid2eid [vocab, K] (hash layers).
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

// What the forward keeps for the backward (sized by moe_act_sizes). Routed slots are stored in expert-sorted
// order: slot r = order[r] is the flat (token*K + k) index; offsets[e]..offsets[e+1] are expert e's slots.
template <class T>
struct MoeActs {
  T* logits = nullptr;     // [N, E]
  T* scores = nullptr;     // [N, E] sqrt(softplus(logits))
  int32_t* sel = nullptr;  // [N, K] selected experts
  T* weight = nullptr;     // [N, K] routed gate weights g_k (rho * s / sum s)
  int32_t* order = nullptr;    // [N*K]
  int32_t* offsets = nullptr;  // [E+1]
  T* gate_pre = nullptr;   // [N*K, f] (sorted slots)
  T* up_pre = nullptr;     // [N*K, f]
  T* sh_gate = nullptr;    // [N, fs]
  T* sh_up = nullptr;      // [N, fs]
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
template <class T>
void moe_fwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const int32_t* token_ids, MoeActs<T>& a, T* out);

// du[N, d] += d/du; grads accumulated. dscores_extra [N, E] (nullable): an extra gradient on the router scores
// (the balance loss), added before the score derivative.
template <class T>
void moe_bwd(const MoeShape& s, const MoeWeights<T>& w, const T* u, const MoeActs<T>& a, const T* dout,
             const T* dscores_extra, T* du, MoeGrads<T>& g);

// Per-expert selection counts over the N tokens (for the aux-loss-free bias update), written to load[E].
void moe_expert_load(const int32_t* sel, int64_t n_tok, int64_t topk, int64_t n_experts, int64_t* load);

// The aux-loss-free bias update rule (design §5): b_e += rate * sign(mean load - load_e). Hash layers have none.
void router_bias_update(float* bias, const int64_t* load, int64_t n_experts, double rate);

}  // namespace trex::dsv4
