// Lightning indexer of CSA layers (design §2.7): its own overlapped compressor produces keys K^I
// [E, c_I]; queries q^I = RoPE(c_Q W_iqb^T) per head; head weights w = a W_wp^T / sqrt(n_I);
// score I[t,s] = sum_h w[t,h] * ReLU(q^I[t,h] . K^I[s]) / sqrt(c_I) over the entries s visible to t.
// Selection: the min(k_sel, #visible) best entries; remaining slots are -1.
//
// Training (optional, off by default): the V3.2-style KL signal L = sum_t KL(p_t || softmax(I_t)) over
// the selected slots, p_t = main attention probability mass of each selected entry summed over heads
// and L1-normalised; the indexer's inputs (a, c_Q) are detached, so only indexer parameters get
// gradient. Window entries are not part of p_t (which set V4 uses is UNCONFIRMED, design §2.7).
#pragma once
#include <cstdint>
#include <vector>

#include "model/dsv4/compressor.h"

namespace trex::dsv4 {

template <typename T>
struct IndexerParamsT {
  T* wq_b = nullptr;                // [n_I*c_I, d_c]
  T* weights_proj = nullptr;        // [n_I, d]
  CompressorParamsT<T> compressor;  // overlapped, width 2*c_I
};

struct IndexerDims {
  int64_t d = 0, d_c = 0, n_heads = 0, head_dim = 0, rope_dim = 0, k_sel = 0;
  double eps = 1e-6;
};

template <typename T>
struct IndexerSaved {
  std::vector<T> keys;  // [E, c_I]
  CompressorSaved<T> cmp;
  std::vector<T> q;      // [N, n_I*c_I] after RoPE
  std::vector<T> w;      // [N, n_I] head weights, already scaled by 1/sqrt(n_I)
  std::vector<T> score;  // [N, k_sel] score of each selected slot (0 for empty slots)
  size_t bytes() const {
    return (keys.size() + q.size() + w.size() + score.size()) * sizeof(T) + cmp.bytes();
  }
};

// sel [N, k_sel]: selected GLOBAL entry indices (plan numbering), best first, -1 for empty slots.
template <typename T>
void indexer_forward(const IndexerParamsT<T>& p, const IndexerDims& dims, const CompressPlan& plan,
                     const SeqLayout& layout, const RopeTable<T>& rope, const T* a, const T* cq, int64_t* sel,
                     IndexerSaved<T>& saved);

// Scores of the given selection (e.g. injected): fills saved.score for the slots of sel.
template <typename T>
void indexer_score_selected(const IndexerDims& dims, const IndexerSaved<T>& saved, int64_t N,
                            const int64_t* sel, std::vector<T>& score);

// dscore [N, k_sel] = dL/dI for the selected slots. Accumulates into the indexer parameter gradients
// only (inputs detached).
template <typename T>
void indexer_backward(const IndexerParamsT<T>& p, const IndexerParamsT<T>& g, const IndexerDims& dims,
                      const CompressPlan& plan, const SeqLayout& layout, const RopeTable<T>& rope, const T* a,
                      const T* cq, const IndexerSaved<T>& saved, const int64_t* sel, const T* dscore);

}  // namespace trex::dsv4
