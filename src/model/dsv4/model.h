// The DeepSeek-V4 model on the CPU: parameter table (official names) + gradient arena, and the block program
// (program.h) over the CPU backend (cpu_backend.h): forward(ids, labels, layout) -> loss and backward() filling
// every gradient. Blocks (design §2.3): mHC site -> attn_norm -> attention -> expand; mHC site -> ffn_norm -> MoE
// -> expand. Then hc_head -> norm -> LM head -> masked next-token CE (one mean over all labelled targets), plus the
// MTP module (design §2.10, weight mtp_weight) and the sequence-wise balance loss (design §5, weight balance_alpha).
//
// Pipeline parallelism: a Model built with a ModelPartition (partition.h) holds one stage's part and runs it with
// forward_stage / backward_stage: stream in [B*S, n_hc, d] -> stream out (or the loss on the head stage), and
// back. Several micro-batches can be in flight (1F1B keeps up to P per stage): each uses an activation slot with
// its own arena. The whole-model forward()/backward() are the one-stage special case on slot 0.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/config.h"
#include "model/dsv4/cpu_backend.h"
#include "model/dsv4/partition.h"
#include "model/dsv4/program.h"
#include "model/dsv4/seq_layout.h"
#include "model/dsv4/weights.h"

namespace trex::dsv4 {

struct ModelOptions {
  double balance_alpha = 1e-4;  // sequence-wise balance loss weight (0 = off; parity uses 0)
  bool balance_hash_layers = false;  // apply it to hash-routed layers too (UNCONFIRMED in the paper)
  double mtp_weight = 0.3;      // lambda of the MTP loss (0.3, then 0.1 after LR decay starts)
  bool use_mtp = true;          // run the MTP module when the config has one
};

// Called during backward when the gradients of a group of tensors are complete for the micro-batch (the data-
// parallel reducer can start reducing them while backward continues): block >= 0 is the block's index (see
// block_prefix) and `params` its tensors, which are contiguous in the gradient arena; block == -1 comes last, with
// every other tensor of the stage (head, final norms, MTP input, embedding).
using GradReadyHook = std::function<void(int64_t block, const std::vector<const ParamInfo*>& params)>;

template <class T>
class Model {
 public:
  explicit Model(const ModelConfig& cfg, const ModelOptions& opts = {}, const ModelPartition& part = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  // The tensors (in declaration order) and buffers a Model with `part` holds, without allocating the arenas
  // (initialisers walk the whole model's list so that every partition gets the same values).
  static ParamTable<T> declared_params(const ModelConfig& cfg, const ModelOptions& opts,
                                       const ModelPartition& part = {});

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opts_; }
  const ModelPartition& partition() const { return part_; }  // resolved (no -1)
  void set_mtp_weight(double w) { opts_.mtp_weight = w; }  // the schedule lowers it when LR decay starts
  ParamTable<T>& params() { return params_; }
  const ParamTable<T>& params() const { return params_; }
  bool has_mtp() const { return mtp_; }
  // Names held by this stage AND another one (the MTP's copy of embed.weight): sum their gradients over stages.
  std::vector<std::string> stage_shared_params() const;

  // Copies tensors by official name (fp32/fp64 host tensors; tid2eid as I64/I32). Every declared tensor and
  // buffer must be present with the declared shape; extra keys are errors unless allow_extra.
  void load(const std::map<std::string, HostTensor>& state, bool allow_extra = false);

  // Whole model only (embed and head). ids, labels: [B, S] row-major; labels < 0 = no loss. Returns the total
  // loss; keeps what backward needs (slot 0).
  double forward(const int32_t* ids, const int32_t* labels, const SeqLayout& layout);
  // Accumulates d(total loss)/d(parameter) into the gradient arena (call params().zero_grads() first).
  void backward();
  const LossParts& loss_parts() const { return loss_parts(cur_); }

  // Stage execution. n_slots activation slots (default 1), each with its own arena, planned on first use.
  void set_slots(int64_t n);
  int64_t n_slots() const { return backend_->n_slots(); }
  // Forward of one micro-batch on `slot` (overwrites what the slot held). ids/labels/layout: the micro-batch (every
  // stage gets them: hash layers and MTP read token ids). x_in [B*S, n_hc, d]: the incoming stream (null on the
  // embed stage); x_out: the outgoing stream (null on the head stage). Returns loss_scale * (this stage's
  // loss_parts(slot).total); backward_stage produces the gradients of that scaled value, so with loss_scale =
  // 1/n_micro the accumulated gradients are those of the mean over micro-batches (what trainer.cpp computes).
  double forward_stage(int64_t slot, const int32_t* ids, const int32_t* labels, const SeqLayout& layout,
                       const T* x_in, T* x_out, double loss_scale = 1.0);
  // Accumulates parameter gradients; dx_out: gradient of the outgoing stream (null on the head stage); dx_in
  // (written; null on the embed stage): gradient of the incoming stream. Hooks fire as gradients complete.
  void backward_stage(int64_t slot, const T* dx_out, T* dx_in);
  const LossParts& loss_parts(int64_t slot) const;
  int64_t stream_elems(int64_t n_tok) const { return n_tok * cfg_.hc_mult * cfg_.hidden; }
  void set_grad_ready_hook(GradReadyHook hook) { hook_ = std::move(hook); }
  // Expert parallelism: where the routed experts this model does not hold live (parallel/ep_exchange.h); its
  // range must equal the partition's expert range. Null (the default): every expert is here, each MoE layer
  // exchanges locally. Not owned; must outlive the forward/backward calls.
  void set_expert_exchange(ExpertExchange<T>* ex);

  // Observables of the last forward (its slot). Block indices are local: this stage's main layers in order,
  // then the MTP block on the head stage.
  const T* logits() const;                                          // [B*S, V] (head stage)
  const T* layer_input(int64_t l) const;  // [B*S, n_hc, d], l in [0, local layers]: input of local layer l
  const T* final_normed() const;                                    // [B*S, d] (head stage)
  const AttentionSaved<T>& attention_saved(int64_t l) const;
  // Per-expert selection counts of block l's MoE over the last batch.
  const std::vector<int64_t>& expert_load(int64_t l) const;
  // Selected experts [B*S, topk] of block l's router in the last forward (GPU parity injects them).
  const int32_t* router_selection(int64_t l) const;
  int64_t n_blocks() const { return int64_t(blocks_.size()); }
  const std::string& block_prefix(int64_t l) const;  // "layers.N." or "mtp.0."
  size_t activation_bytes() const;  // all slots
  // This stage's blocks (main layers, then the MTP block) as the CPU backend reads them: a decoder runs its own
  // backend over them.
  std::vector<const CpuBlock<T>*> cpu_blocks() const;

 private:
  Model(const ModelConfig& cfg, const ModelOptions& opts, const ModelPartition& part, bool allocate);
  void new_block(const std::string& prefix, const ModelConfig& lcfg, int64_t layer);
  void bind_block(CpuBlock<T>& b);
  const CpuSlot<T>& last_slot() const { return backend_->slot(cur_); }

  ModelConfig cfg_, cfg_ext_;  // cfg_ext_: + one sliding / score-MoE layer for the MTP block
  ModelOptions opts_;
  ModelPartition part_;
  ParamTable<T> params_;
  std::vector<std::unique_ptr<CpuBlock<T>>> blocks_;  // this stage's main layers, then the MTP block
  bool mtp_ = false;
  std::vector<std::pair<size_t, size_t>> block_entries_;    // each block's tensors: params_.entries()[first, last)
  std::vector<std::vector<const ParamInfo*>> block_params_;  // the same, for the gradient-ready hook
  std::vector<const ParamInfo*> rest_params_;                 // the hook's block -1 group
  std::unique_ptr<CpuBackend<T>> backend_;
  std::unique_ptr<BlockProgram> program_;
  int64_t cur_ = 0;  // slot of the last forward
  GradReadyHook hook_;
};

}  // namespace trex::dsv4
