// Output head (design §2.10): hc_head collapse of the final streams -> weighted RMSNorm -> LM head (untied).
// Used by the main model and, with the MTP module's own hc_head/norm and the shared LM head, by the MTP.
#pragma once
#include <cstdint>

#include "model/dsv4/mhc.h"

namespace trex::dsv4 {

template <class T>
struct HeadParams {
  const T* hc_fn = nullptr;     // [n_hc, n_hc*d]
  const T* hc_base = nullptr;   // [n_hc]
  const T* hc_scale = nullptr;  // [1]
  const T* norm = nullptr;      // [d]
  const T* head = nullptr;      // [V, d]
};
template <class T>
struct HeadGrads {  // accumulated; any may be null except where the backward needs the input gradient
  T* hc_fn = nullptr;
  T* hc_base = nullptr;
  T* hc_scale = nullptr;
  T* norm = nullptr;
  T* head = nullptr;
};
template <class T>
struct HeadActs {
  T* mix = nullptr;        // [N, n_hc]
  T* hc_rstd = nullptr;    // [N]
  T* w = nullptr;          // [N, n_hc]
  T* collapsed = nullptr;  // [N, d]
  T* norm_rstd = nullptr;  // [N]
  T* normed = nullptr;     // [N, d]  (the "final normed output" hidden state)
  T* logits = nullptr;     // [N, V]
};
// Elements of T the acts need (excluding logits, which callers often own).
inline int64_t head_act_elems(int64_t n_tok, int64_t n_hc, int64_t d) {
  return n_tok * (2 * n_hc + 2 + 2 * d);
}
template <class T>
HeadActs<T> head_acts_bind(int64_t n_tok, int64_t n_hc, int64_t d, T* buf, T* logits);

template <class T>
void head_fwd(const MhcShape& s, int64_t vocab, const T* X, const HeadParams<T>& p, HeadActs<T>& a);
// dX [N, n_hc, d] accumulated from dlogits [N, V]. scratch: N*(d + n_hc) elements.
template <class T>
void head_bwd(const MhcShape& s, int64_t vocab, const T* X, const HeadParams<T>& p, const HeadActs<T>& a,
              const T* dlogits, T* dX, HeadGrads<T>& g, T* scratch);

}  // namespace trex::dsv4
