// Multi-token prediction input (design §2.10): for position t, e = e_proj(enorm(Embed[token t+1])) and
// H[j] = h_proj(hnorm(X^L_t[j])) per stream j; the MTP block's input streams are H[j] + e. The MTP block itself is
// an ordinary sliding-window + score-MoE block and its head is head.h with the MTP's hc_head/norm and the shared
// LM head; the model (model.cpp) chains them and weights the MTP loss.
#pragma once
#include <cstdint>

namespace trex::dsv4 {

template <class T>
struct MtpInputParams {
  const T* enorm = nullptr;   // [d]
  const T* hnorm = nullptr;   // [d]
  const T* e_proj = nullptr;  // [d, d]
  const T* h_proj = nullptr;  // [d, d]
};
template <class T>
struct MtpInputGrads {
  T* enorm = nullptr;
  T* hnorm = nullptr;
  T* e_proj = nullptr;
  T* h_proj = nullptr;
};
template <class T>
struct MtpInputActs {
  T* emb = nullptr;     // [N, d] Embed[next token] (0 where there is none)
  T* e_rstd = nullptr;  // [N]
  T* e_norm = nullptr;  // [N, d]
  T* h_rstd = nullptr;  // [N*n_hc]
  T* h_norm = nullptr;  // [N*n_hc, d]
};
inline int64_t mtp_input_act_elems(int64_t n_tok, int64_t n_hc, int64_t d) {
  return n_tok * (2 * d + 1) + n_tok * n_hc * (d + 1);
}
template <class T>
MtpInputActs<T> mtp_input_acts_bind(int64_t n_tok, int64_t n_hc, int64_t d, T* buf);

// next_ids[N]: the token at t+1 of the same row and document, -1 where there is none.
template <class T>
void mtp_input_fwd(int64_t n_tok, int64_t n_hc, int64_t d, double eps, const int32_t* next_ids, const T* embed,
                   int64_t vocab, const T* XL, const MtpInputParams<T>& p, MtpInputActs<T>& a, T* Xmtp);
// dXL += ..., dembed += ... (rows of next tokens), grads accumulated.
template <class T>
void mtp_input_bwd(int64_t n_tok, int64_t n_hc, int64_t d, const int32_t* next_ids, const T* XL,
                   const MtpInputParams<T>& p, const MtpInputActs<T>& a, const T* dXmtp, T* dXL, T* dembed,
                   MtpInputGrads<T>& g);

}  // namespace trex::dsv4
