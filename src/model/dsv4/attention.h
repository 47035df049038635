// DeepSeek-V4 attention sub-layer on the CPU (design §2.4–§2.8, §2.11): low-rank Q with per-head
// RMS norm, single shared K=V head, partial interleaved RoPE, sliding window + compressed entries
// (HCA dense, CSA top-k from the lightning indexer), per-head sink, inverse RoPE on the output and
// the grouped low-rank output projection. Explicit forward and hand-written backward, templated on
// the scalar (float for training, double for finite-difference tests).
//
// Input a [B*T, d] is the attn_norm output; output [B*T, d] is the sub-layer result before mHC expand.
//
// Memory kept by forward (AttentionSaved, per layer, T = scalar bytes), N = B*T tokens, E compressed
// entries (~N/m): N*(2*d_c + 2*n_h*c + n_h + 2*c + g*d_g + 3) + E*(2c + 1) + N*2*width*c (compressor
// projections) scalars, plus N*k_sel int64 twice for CSA; the input `a` is NOT copied (the caller keeps
// it alive until backward). Flash (d_c 1024, n_h 64, c 512, g*d_g 8192): ~0.33 MB/token in fp32.
// Backward temporaries are of the same order, plus one [N+E, c] accumulator per OpenMP thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/dsv4/compressor.h"
#include "model/dsv4/config.h"
#include "model/dsv4/indexer.h"
#include "model/dsv4/rope.h"
#include "model/dsv4/seq_layout.h"

namespace trex::dsv4 {

// Every attention parameter of one layer as raw pointers, named after the official checkpoint keys
// (design §3.2/§3.3). Null where the layer type lacks the tensor. The same type holds gradients:
// backward ACCUMULATES (+=) into every non-null gradient pointer.
template <typename T>
struct AttentionParamsT {
  T* wq_a = nullptr;                // [d_c, d]
  T* q_norm = nullptr;              // [d_c]
  T* wq_b = nullptr;                // [n_h*c, d_c]
  T* wkv = nullptr;                 // [c, d]
  T* kv_norm = nullptr;             // [c]
  T* wo_a = nullptr;                // [g*d_g, (n_h/g)*c]
  T* wo_b = nullptr;                // [d, g*d_g]
  T* attn_sink = nullptr;           // [n_h]
  CompressorParamsT<T> compressor;  // CSA: wkv/wgate [2c,d], ape [m,2c]; HCA: [c,d], [m',c]; norm [c]
  IndexerParamsT<T> indexer;        // CSA only
};
using AttentionParams = AttentionParamsT<float>;

// One slot per parameter tensor, in the order attention_param_specs lists them.
enum class AttnParam {
  wq_a,
  q_norm,
  wq_b,
  wkv,
  kv_norm,
  wo_a,
  wo_b,
  attn_sink,
  cmp_wkv,
  cmp_wgate,
  cmp_ape,
  cmp_norm,
  idx_wq_b,
  idx_weights_proj,
  idx_cmp_wkv,
  idx_cmp_wgate,
  idx_cmp_ape,
  idx_cmp_norm,
};

struct AttentionParamSpec {
  std::string name;  // official key suffix after "layers.N.", e.g. "attn.wq_a.weight"
  Shape shape;
  AttnParam slot;
  bool lm_grad = true;  // false for the indexer's tensors: the LM loss gives them no gradient
};

// The parameter tensors of attention layer `layer` (sliding: 8, HCA: 12, CSA: 18).
std::vector<AttentionParamSpec> attention_param_specs(const ModelConfig& cfg, int64_t layer);

// The pointer field of `p` that a slot names.
template <typename T>
T*& param_slot(AttentionParamsT<T>& p, AttnParam slot);

// Points the fields of `p` at consecutive slices of `base`, in spec order (no padding). Returns the
// number of scalars used (= sum of the specs' numels).
template <typename T>
int64_t bind_attention_params(AttentionParamsT<T>& p, const std::vector<AttentionParamSpec>& specs, T* base);

// Sizes of one layer, derived from the config.
struct AttentionDims {
  int64_t d = 0, d_c = 0, n_heads = 0, head_dim = 0, rope_dim = 0, o_groups = 0, o_rank = 0, window = 0;
  AttnType type = AttnType::Sliding;
  int64_t ratio = 0;  // 0 for sliding layers
  int64_t index_heads = 0, index_head_dim = 0, index_topk = 0;
  double eps = 1e-6;
  std::vector<double> inv_freq;  // this layer's rotary table (main or compress)

  static AttentionDims from_config(const ModelConfig& cfg, int64_t layer);
};

struct AttentionOptions {
  // Injected CSA selections [B*T, index_topk], row-local entry indices, -1 = empty slot; they replace
  // the indexer's choice (every index must be visible to its query). Null = use the indexer.
  const int64_t* forced_topk = nullptr;
  // Indexer KL training signal (design §2.7), off by default; loss = weight * sum_t KL(p_t || q_t).
  bool indexer_kl = false;
  double indexer_kl_weight = 1.0;
};

template <typename T>
struct AttentionSaved {
  const T* a = nullptr;  // the caller's input (not copied)
  RopeTable<T> rope;
  std::vector<T> qa;               // [N, d_c] wq_a output (before q_norm)
  std::vector<T> qa_rstd;          // [N]
  std::vector<T> cq;               // [N, d_c] q_norm output (also the indexer's query input)
  std::vector<T> q;                // [N, n_h, c] final queries (per-head normed, RoPE applied)
  std::vector<T> q_rstd;           // [N, n_h]
  std::vector<T> kvp;              // [N, c] wkv output (before kv_norm)
  std::vector<T> kv_rstd;          // [N]
  std::vector<T> kv;               // [N, c] window keys/values (normed, RoPE applied)
  std::vector<T> o;                // [N, n_h, c] attention output before the inverse RoPE
  std::vector<T> lse;              // [N, n_h] log of the softmax denominator (incl. sink)
  std::vector<T> r;                // [N, g*d_g] grouped projection output (wo_b input)
  std::vector<int64_t> win_begin;  // [N] first window key (global token index)
  // Compressed path (CSA / HCA).
  CompressPlan plan;
  std::vector<T> cmp;  // [E, c] compressed entries
  CompressorSaved<T> cmp_saved;
  // CSA selections [N, index_topk]: topk row-local (observable; -1 = empty), sel the same as global
  // entry indices (what the attention core reads).
  std::vector<int64_t> topk, sel;
  IndexerSaved<T> idx;  // only when the indexer ran
  // Indexer KL (when enabled): d(loss)/d(score) of each selected slot, and the loss value.
  std::vector<T> kl_dscore;
  double indexer_kl_loss = 0.0;

  size_t bytes() const;
};

template <typename T>
class AttentionLayerT {
 public:
  AttentionLayerT(const ModelConfig& cfg, int64_t layer);
  const AttentionDims& dims() const { return dims_; }

  // a [N, d] -> out [N, d] (overwritten). Fills `saved` for backward; `a` must stay alive until then.
  void forward(const AttentionParamsT<T>& p, const T* a, T* out, const SeqLayout& layout,
               AttentionSaved<T>& saved, const AttentionOptions& opts = {}) const;

  // dout [N, d]. Accumulates parameter gradients into `g` (null fields skipped) and the input gradient
  // into da [N, d]. Indexer parameters get gradient only when forward ran with indexer_kl.
  void backward(const AttentionParamsT<T>& p, const AttentionParamsT<T>& g, const SeqLayout& layout,
                const AttentionSaved<T>& saved, const T* dout, T* da) const;

 private:
  AttentionDims dims_;
};
using AttentionLayer = AttentionLayerT<float>;

}  // namespace trex::dsv4
