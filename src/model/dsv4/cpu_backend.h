// The CPU backend of the block program (backend.h): today's fp32 / fp64 host math (attention.h, mhc.h, moe.h,
// head.h, mtp.h, embedding.h, loss.h, balance.h), the reference every other backend is checked against.
//
// It reads the parameters in place: a CpuBlock holds one block's parameter and gradient pointers into the
// ParamTable (the Model declares and binds them), and the head / embedding / MTP input tensors are found by name.
// Training passes keep their activations per slot, carved from one arena per slot (plan_slot); a decode pass
// reuses one set of step buffers and reads / extends the per-sequence caches (cpu_backend_cache.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/dsv4/attention.h"
#include "model/dsv4/backend.h"
#include "model/dsv4/config.h"
#include "model/dsv4/head.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/mtp.h"
#include "model/dsv4/weights.h"

namespace trex::dsv4 {

// One transformer block's parameters and gradients (pointers into the ParamTable).
template <class T>
struct CpuBlock {
  std::string prefix;  // "layers.3." or "mtp.0."
  int64_t layer = 0;   // index into the extended config (main layers, then the MTP block)
  bool hash = false;
  std::unique_ptr<AttentionLayerT<T>> attn;
  std::vector<AttentionParamSpec> aspecs;
  AttentionParamsT<T> ap, ag;
  T *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  T *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  T *attn_norm = nullptr, *ffn_norm = nullptr;
  T *g_hc_attn_fn = nullptr, *g_hc_attn_base = nullptr, *g_hc_attn_scale = nullptr;
  T *g_hc_ffn_fn = nullptr, *g_hc_ffn_base = nullptr, *g_hc_ffn_scale = nullptr;
  T *g_attn_norm = nullptr, *g_ffn_norm = nullptr;
  MoeShape moe;  // n_tok unused (each pass sets its own copy)
  MoeWeights<T> mw;
  MoeGrads<T> mg;
};

// What one block keeps of a training forward for its backward, per slot.
template <class T>
struct CpuBlockActs {
  MhcSiteActs<T> sa, sf;
  T *col_a = nullptr, *a = nullptr, *a_rstd = nullptr, *y_a = nullptr, *X_mid = nullptr;
  T *col_f = nullptr, *u = nullptr, *u_rstd = nullptr, *y_f = nullptr, *moe_t = nullptr;
  std::vector<int32_t> moe_i;
  MoeActs<T> macts;
  AttentionSaved<T> asaved;
  std::vector<T> dscores;  // balance-loss gradient on the router scores [N, E], x loss scale (empty when off)
  std::vector<int64_t> load;
};

// One micro-batch in flight: arena, streams, head / MTP activations, loss terms.
template <class T>
struct CpuSlot {
  std::vector<T> act;  // one arena, carved by plan_slot
  int64_t B = 0, S = 0;
  std::vector<T*> X;   // main layers + 1 streams; X[0] is the stage input
  std::vector<CpuBlockActs<T>> blocks;
  HeadActs<T> head_acts{};
  std::vector<T> logits, lse;
  T* Xm_in = nullptr;
  T* Xm_out = nullptr;
  MtpInputActs<T> mtp_in_acts{};
  HeadActs<T> mtp_head_acts{};
  std::vector<T> mtp_logits, mtp_lse;
  LossParts loss;
};

struct CpuBackendShape {
  bool embed = true, head = true, mtp = false;  // what the stage holds (as ProgramShape)
  int64_t n_layers = 0;                         // main layers (blocks [0, n_layers); block n_layers = MTP)
  int64_t expert_begin = 0, expert_end = 0;     // the routed experts this process holds
};

template <class T>
class CpuBackend final : public Backend {
 public:
  // cfg: the model's config (not extended). blocks: this stage's main layers, then the MTP block; not owned.
  CpuBackend(const ModelConfig& cfg, ParamTable<T>& params, std::vector<const CpuBlock<T>*> blocks,
             const CpuBackendShape& shape);
  ~CpuBackend() override;

  void set_slots(int64_t n);
  int64_t n_slots() const { return int64_t(slots_.size()); }
  const CpuSlot<T>& slot(int64_t i) const;
  size_t activation_bytes() const;  // all slots
  // Where the routed experts this process does not hold live (null: every expert is here). Not owned.
  void set_expert_exchange(ExpertExchange<T>* ex) { ex_ = ex; }

  void begin_pass(const Pass& p) override;
  void embed_fwd(const Pass& p, Stream out) override;
  void embed_bwd(const Pass& p, Stream d_out) override;
  void stream_in(const Pass& p, Stream s, const void* src) override;
  void stream_out(const Pass& p, Stream s, void* dst) override;
  void site_norm_fwd(const Pass& p, int64_t blk, Site s, Stream in) override;
  void site_norm_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_in) override;
  void expand_fwd(const Pass& p, int64_t blk, Site s, Stream in, Stream out) override;
  void expand_bwd(const Pass& p, int64_t blk, Site s, Stream in, Stream d_out, Stream d_in) override;
  void attention_fwd(const Pass& p, int64_t blk) override;
  void attention_bwd(const Pass& p, int64_t blk) override;
  void attention_cached(const Pass& p, int64_t blk) override;
  void moe_fwd(const Pass& p, int64_t blk) override;
  void moe_bwd(const Pass& p, int64_t blk) override;
  void balance_fwd(const Pass& p, int64_t blk, double alpha, double grad_scale) override;
  void head_loss_fwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets) override;
  void head_loss_bwd(const Pass& p, HeadKind h, Stream in, const int32_t* targets, double weight, Stream d_in,
                     bool accumulate) override;
  void head_logits(const Pass& p, Stream in, const int64_t* rows, int64_t n_rows, float* logits) override;
  void mtp_input_fwd(const Pass& p, const int32_t* next_ids, Stream main, Stream out) override;
  void mtp_input_bwd(const Pass& p, const int32_t* next_ids, Stream main, Stream d_out, Stream d_main,
                     bool accumulate) override;
  void release_block(const Pass& p, int64_t blk) override;  // recomputation is the GPU model's: an error here
  LossParts losses(const Pass& p) override;
  std::unique_ptr<SequenceCaches> new_caches() const override;

 private:
  struct SiteRef;   // the activations of one (block, site) in a pass
  struct StepBufs;  // a decode step's buffers
  struct GradBufs;  // the backward's gradient streams and per-site gradients
  CpuSlot<T>& slot_of(const Pass& p);
  void plan_slot(CpuSlot<T>& s, int64_t B, int64_t S);
  T* stream(const Pass& p, Stream s);
  SiteRef site(const Pass& p, int64_t blk, Site s);
  MhcShape mhc_shape(int64_t n_tok) const;
  HeadParams<T> head_params(HeadKind h);
  HeadGrads<T> head_grads(HeadKind h);
  ExpertExchange<T>* expert_exchange() const;

  ModelConfig cfg_;
  ParamTable<T>& params_;
  std::vector<const CpuBlock<T>*> blocks_;
  CpuBackendShape shape_;
  std::vector<std::unique_ptr<CpuSlot<T>>> slots_;
  std::unique_ptr<StepBufs> step_;
  std::unique_ptr<GradBufs> grads_;
  std::vector<std::vector<float>> inv_freq_;  // decode: each main layer's rotary frequencies in fp32
  ExpertExchange<T>* ex_ = nullptr;
};

}  // namespace trex::dsv4
