// The DeepSeek-V4 model on the CPU: parameter table (official names) + gradient arena, an activation arena sized
// from a table, forward(ids, labels, layout) -> loss and a hand-written backward() filling every gradient.
// Blocks (design §2.3): mHC site -> attn_norm -> attention -> expand; mHC site -> ffn_norm -> MoE -> expand.
// Then hc_head -> norm -> LM head -> masked next-token CE (one mean over all labelled targets), plus the MTP
// module (design §2.10, weight mtp_weight) and the sequence-wise balance loss (design §5, weight balance_alpha).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/config.h"
#include "model/dsv4/head.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/mtp.h"
#include "model/dsv4/seq_layout.h"
#include "model/dsv4/weights.h"

namespace trex::dsv4 {

struct ModelOptions {
  double balance_alpha = 1e-4;  // sequence-wise balance loss weight (0 = off; parity uses 0)
  bool balance_hash_layers = false;  // apply it to hash-routed layers too (UNCONFIRMED in the paper)
  double mtp_weight = 0.3;      // lambda of the MTP loss (0.3, then 0.1 after LR decay starts)
  bool use_mtp = true;          // run the MTP module when the config has one
};

struct LossParts {
  double total = 0;
  double lm = 0;       // mean CE of the main head
  double mtp = 0;      // mean CE of the MTP head (unweighted)
  double balance = 0;  // already multiplied by alpha, summed over layers
  int64_t lm_targets = 0, mtp_targets = 0;
};

template <class T>
class Model {
 public:
  explicit Model(const ModelConfig& cfg, const ModelOptions& opts = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  void set_mtp_weight(double w) { opts_.mtp_weight = w; }  // the schedule lowers it when LR decay starts
  ParamTable<T>& params() { return params_; }
  const ParamTable<T>& params() const { return params_; }
  bool has_mtp() const { return mtp_ != nullptr; }

  // Copies tensors by official name (fp32/fp64 host tensors; tid2eid as I64/I32). Every declared tensor and
  // buffer must be present with the declared shape; extra keys are errors unless allow_extra.
  void load(const std::map<std::string, HostTensor>& state, bool allow_extra = false);

  // ids, labels: [B, S] row-major; labels < 0 = no loss. Returns the total loss; keeps what backward needs.
  double forward(const int32_t* ids, const int32_t* labels, const SeqLayout& layout);
  // Accumulates d(total loss)/d(parameter) into the gradient arena (call params().zero_grads() first).
  void backward();
  const LossParts& loss_parts() const { return loss_; }

  // Observables of the last forward.
  const T* logits() const { return logits_.data(); }               // [B*S, V]
  const T* layer_input(int64_t l) const { return X_[size_t(l)]; }  // [B*S, n_hc, d], l in [0, L]
  const T* final_normed() const { return head_acts_.normed; }      // [B*S, d]
  const AttentionSaved<T>& attention_saved(int64_t l) const;
  // Per-expert selection counts of layer l's MoE (the MTP block is index L) over the last batch.
  const std::vector<int64_t>& expert_load(int64_t l) const;
  // Selected experts [B*S, topk] of block l's router in the last forward (GPU parity injects them).
  const int32_t* router_selection(int64_t l) const;
  int64_t n_blocks() const { return int64_t(blocks_.size()); }
  size_t activation_bytes() const { return act_.size() * sizeof(T); }

  struct Block;  // one transformer block (defined in model.cpp)

 private:
  void declare_block(const std::string& prefix, const ModelConfig& lcfg, int64_t layer);
  void bind_block(Block& b);
  void plan_activations(int64_t B, int64_t S);
  void block_fwd(Block& b, const T* Xin, T* Xout, const int32_t* ids, const SeqLayout& layout);
  void block_bwd(Block& b, const T* Xin, const T* dXout, T* dXin, const SeqLayout& layout);

  ModelConfig cfg_, cfg_ext_;  // cfg_ext_: + one sliding / score-MoE layer for the MTP block
  ModelOptions opts_;
  ParamTable<T> params_;
  std::vector<std::unique_ptr<Block>> blocks_;  // main layers, then the MTP block
  Block* mtp_ = nullptr;

  // Activations (one arena, carved by plan_activations from its size table).
  std::vector<T> act_;
  int64_t B_ = 0, S_ = 0;
  std::vector<T*> X_;  // L+1 stream tensors
  HeadActs<T> head_acts_{};
  std::vector<T> logits_, lse_;
  std::vector<int32_t> ids_, targets_, mtp_targets_, next_ids_;
  // MTP
  T* Xm_in_ = nullptr;
  T* Xm_out_ = nullptr;
  MtpInputActs<T> mtp_in_acts_{};
  HeadActs<T> mtp_head_acts_{};
  std::vector<T> mtp_logits_, mtp_lse_;
  const SeqLayout* layout_ = nullptr;
  SeqLayout layout_copy_;
  LossParts loss_;
  bool forward_done_ = false;
};

}  // namespace trex::dsv4
