// The CUDA engine: the Engine interface (engine.h) on one GPU. Weights are the GPU model's bf16 compute copy
// (model/cuda/gpu_model.h, built for inference: no gradients; random by seed or loaded from a CPU parameter table).
// A step runs every per-token computation batched over all new tokens of all feeds (embedding, fused mHC site +
// norm, projections, MoE through the training model's moe_fwd with the grouped expert GEMMs, head) with the
// training kernels. Per-slot device caches hold what V4 needs and nothing else: the last `window` raw K=V rows, the
// compressed CSA / HCA entries and the indexer keys (S/m each), and the compressor rows not yet pooled (m, or 2m
// when overlapped); the decode kernels (kernels/cuda/decode_attention.h) build entries and keep the rings. Core
// attention of prefill chunks and decoded tokens alike runs on the training tensor-core kernel
// (sparse_attention_fwd): the step's own kv rows are its window rows, and older window rows and compressed entries
// are selected rows of the layer's combined [entries | window rings] array (decode_key_sets); the per-warp decode
// kernel stays as the reference (reference_attention). A prompt chunk and a decoded token are the same
// thing to a step, so prefill and decode of different slots share one step. forward_greedy picks each feed's token
// on the device (one id per feed comes back instead of [feeds, vocab] fp32 logits); options.profile times the
// phases of every step with CUDA events and host clocks (StepProfile).
// With speculation on (make_cuda_engine(..., speculative_mtp)), the checkpoint's MTP module runs after every step
// (speculative.h): forward_greedy_speculative verifies last step's draft in the same step as the fed token.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "infer/cuda_mtp.h"
#include "infer/engine.h"
#include "infer/speculative.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/hc_head.h"
#include "kernels/cuda/indexer.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/mhc_generic.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/speculative_rows.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/dsv4/rope.h"
#include "model/cuda/gpu_impl.h"

namespace trex::infer {
namespace {

using dsv4gpu::bf16;
using dsv4gpu::DevMem;
using dsv4gpu::Pool;

constexpr int64_t kDefaultMaxContext = 16384;  // caches are allocated up front for this many tokens per slot

// One layer's caches of all slots (contiguous per slot; slot s owns rows [s * per_slot, (s + 1) * per_slot)).
// The compressed entries and the window ring share one allocation, so that the tensor-core attention reaches both
// through one key array (decode_key_sets).
struct LayerCache {
  DevMem keys;         // [slots * cap + slots * W, c]: the compressed entries, then the window rings
  bf16* cmp = nullptr;  // [slots, cap, c] compressed entries (CSA / HCA; start of keys)
  bf16* win = nullptr;  // [slots, W, c] window rings (keys + slots * cap rows)
  DevMem ckv, cgate;   // [slots, rows, w*c] compressor rows not yet pooled (and, CSA, the previous window's)
  DevMem ikeys;        // CSA: [slots, cap, c_I] indexer keys
  DevMem ikv, igate;   // CSA: [slots, 2m, 2 c_I]
  int64_t cap = 0, rows = 0;
};

dsv4gpu::RopeDev make_rope(const std::vector<double>& inv_freq, int64_t n_pos) {
  const dsv4::RopeTable<float> t = dsv4::make_rope_table<float>(inv_freq, n_pos);
  dsv4gpu::RopeDev r;
  r.n_pairs = t.n_pairs, r.n_pos = n_pos;
  r.cos = DevMem(t.cos.size() * sizeof(float));
  r.sin = DevMem(t.sin.size() * sizeof(float));
  TREX_CUDA(cudaMemcpy(r.cos.as<float>(), t.cos.data(), t.cos.size() * sizeof(float), cudaMemcpyHostToDevice));
  TREX_CUDA(cudaMemcpy(r.sin.as<float>(), t.sin.data(), t.sin.size() * sizeof(float), cudaMemcpyHostToDevice));
  return r;
}

DevMem zeroed(size_t bytes) {
  DevMem m(bytes);
  if (bytes) TREX_CUDA(cudaMemsetAsync(m.as<char>(), 0, bytes, nullptr));
  return m;
}

// Host-side plan of one step: the per-token / per-item arrays and the entries completed per ratio.
struct StepPlan {
  std::vector<int32_t> ids, pos, item, slot, first, begin;
  std::map<int64_t, std::pair<std::vector<int32_t>, std::vector<int32_t>>> entries;  // ratio -> (item, idx)
  std::map<int64_t, int64_t> max_visible;                                              // ratio -> max (pos+1)/m
};

// Per-phase device time of the steps (options.profile): CUDA events between the phases of every step, read
// after the step's final copy, summed per step kind (decode steps of N tokens, or prefill/mixed); also the host
// time inside forward and between forwards (the scheduler's own work). Printed to stderr when the engine dies.
class StepProfile {
 public:
  static constexpr int kPhases = 8;
  static constexpr const char* kNames[kPhases] = {"embed",     "mhc+norm", "attn-proj+cmp+idx", "attn-core",
                                                  "attn-out", "moe",      "head",              "copy"};
  bool on = false;

  ~StepProfile() {
    if (!on) return;
    for (const auto& [key, a] : acc_) {
      const double n = double(std::max<int64_t>(a.steps, 1));
      std::string line = fmt::format("PROFILE {} steps {}: per step ms", key, a.steps);
      double tot = 0;
      for (int k = 0; k < kPhases; ++k) line += fmt::format(" {} {:.3f}", kNames[k], a.ms[k] / n), tot += a.ms[k];
      line += fmt::format(" | device total {:.3f}, host in forward {:.3f}, host between forwards {:.3f} | host "
                          "enqueue ms",
                          tot / n, a.host_in / n, a.host_out / n);
      for (int k = 0; k < kPhases; ++k) line += fmt::format(" {} {:.3f}", kNames[k], a.host_ms[k] / n);
      line += fmt::format(" | GEMM heuristic queries {}", a.heuristics);
      if (a.unreadable) line += fmt::format(" ({} intervals unreadable)", a.unreadable);
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  }
  // Starts a step; mark(phase) closes the running interval into `phase`'s sum.
  void begin(const std::string& key, const cuda::Gemm* gemm) {
    if (!on) return;
    key_ = key, used_ = 0, phase_of_.clear();
    gemm_ = gemm, heur0_ = gemm ? gemm->heuristic_calls() : 0;
    t_begin_ = std::chrono::steady_clock::now();
    record();
  }
  void mark(int phase) {
    if (!on) return;
    phase_of_.push_back(phase);
    record();
  }
  // After the step's last copy (the stream is synchronised).
  void end() {
    if (!on) return;
    Acc& a = acc_[key_];
    const auto now = std::chrono::steady_clock::now();
    // Every event is waited for before its interval is read (the 22:45 device run read an unfinished one: CUDA
    // error 600 killed the requests). A profile never fails a step: an unreadable interval is counted and skipped.
    for (size_t k = 0; k < used_; ++k) TREX_CUDA(cudaEventSynchronize(ev_[k]));
    for (size_t k = 0; k < phase_of_.size(); ++k) {
      a.host_ms[phase_of_[k]] += std::chrono::duration<double, std::milli>(t_[k + 1] - t_[k]).count();
      float ms = 0;
      if (cudaEventElapsedTime(&ms, ev_[k], ev_[k + 1]) == cudaSuccess)
        a.ms[phase_of_[k]] += ms;
      else
        a.unreadable += 1, (void)cudaGetLastError();
    }
    a.steps += 1;
    if (gemm_) a.heuristics += gemm_->heuristic_calls() - heur0_;
    a.host_in += std::chrono::duration<double, std::milli>(now - t_begin_).count();
    if (has_last_) a.host_out += std::chrono::duration<double, std::milli>(t_begin_ - t_last_end_).count();
    t_last_end_ = now, has_last_ = true;
  }

 private:
  struct Acc {
    int64_t steps = 0;
    double ms[kPhases] = {};     // between the phase's events on the stream (device time, or host-bound gaps)
    double host_ms[kPhases] = {};  // host time enqueueing the phase (a phase with host >= device is host-bound)
    double host_in = 0, host_out = 0;
    int64_t unreadable = 0;
    int64_t heuristics = 0;  // cuBLASLt heuristic queries (GEMM plan cache misses) during these steps
  };
  void record() {
    if (used_ == ev_.size()) {
      cudaEvent_t e = nullptr;
      TREX_CUDA(cudaEventCreate(&e));
      ev_.push_back(e);
    }
    if (t_.size() <= used_) t_.resize(used_ + 1);
    t_[used_] = std::chrono::steady_clock::now();
    TREX_CUDA(cudaEventRecord(ev_[used_++], nullptr));
  }
  const cuda::Gemm* gemm_ = nullptr;
  int64_t heur0_ = 0;
  std::vector<cudaEvent_t> ev_;
  std::vector<std::chrono::steady_clock::time_point> t_;  // host time of each record
  size_t used_ = 0;
  std::vector<int> phase_of_;
  std::string key_;
  std::map<std::string, Acc> acc_;
  std::chrono::steady_clock::time_point t_begin_, t_last_end_;
  bool has_last_ = false;
};

class CudaEngine final : public Engine, public SpeculativeEngine {
 public:
  CudaEngine(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights, const CudaEngineOptions& o,
             bool speculative_mtp)
      : cfg_(cfg), slots_(o.slots), speculate_(speculative_mtp) {
    TREX_CHECK(o.slots >= 1, "cuda engine: need at least one slot, got {}", o.slots);
    // hc_mult 4 runs the fast mHC kernels, 1..3 (the golden fixtures b and c) the generic ones (mhc_generic.h).
    TREX_CHECK(cfg.hc_mult >= 1 && cfg.hc_mult <= cuda::kMhcGenericMaxStreams,
               "cuda engine: hc_mult {} unsupported (the mHC kernels serve 1..{})", cfg.hc_mult,
               cuda::kMhcGenericMaxStreams);
    max_context_ = o.max_context > 0 ? o.max_context : std::min(cfg.max_position, kDefaultMaxContext);
    TREX_CHECK(max_context_ > 0, "cuda engine: no context limit (config max_position_embeddings is {})",
               cfg.max_position);
    TREX_CHECK(max_context_ <= cfg.max_position || cfg.max_position <= 0,
               "cuda engine: max_context {} exceeds the config's max_position_embeddings {}", max_context_,
               cfg.max_position);
    dsv4gpu::GpuModelOptions mo;
    mo.moe_grouped_gemm = o.moe_grouped_gemm;
    mo.gradients = false;
    // The main model without the MTP block (loaded below when speculating, else skipped).
    dsv4::ModelConfig main_cfg = cfg;
    main_cfg.n_mtp = 0;
    model_ = std::make_unique<dsv4gpu::GpuModel>(main_cfg, mo);
    if (weights)
      model_->load_from(*weights);
    else
      model_->init_random(o.seed);
    dsv4gpu::GpuModel::Impl& m = model_->impl();
    rope_main_ = make_rope(dsv4::rope_inv_freq(cfg.rope_main, cfg.rope_dim), max_context_);
    rope_compress_ = make_rope(dsv4::rope_inv_freq(cfg.rope_compress, cfg.rope_dim), max_context_);
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      const dsv4::AttentionDims& D = m.blocks[size_t(l)]->dims;
      LayerCache C;
      const size_t S = size_t(slots_), c = size_t(D.head_dim);
      if (D.type != dsv4::AttnType::Sliding) C.cap = max_context_ / D.ratio;
      C.keys = zeroed(S * size_t(C.cap + D.window) * c * sizeof(bf16));
      C.cmp = C.keys.as<bf16>();
      C.win = C.cmp + S * size_t(C.cap) * c;
      if (D.type != dsv4::AttnType::Sliding) {
        const bool csa = D.type == dsv4::AttnType::CSA;
        C.rows = (csa ? 2 : 1) * D.ratio;
        const size_t w = csa ? 2 : 1;
        C.ckv = zeroed(S * size_t(C.rows) * w * c * sizeof(bf16));
        C.cgate = zeroed(S * size_t(C.rows) * w * c * sizeof(bf16));
        if (csa) {
          const size_t cI = size_t(D.index_head_dim);
          C.ikeys = zeroed(S * size_t(std::max<int64_t>(C.cap, 1)) * cI * sizeof(bf16));
          C.ikv = zeroed(S * size_t(2 * D.ratio) * 2 * cI * sizeof(bf16));
          C.igate = zeroed(S * size_t(2 * D.ratio) * 2 * cI * sizeof(bf16));
        }
      }
      caches_.push_back(std::move(C));
    }
    lengths_.assign(size_t(slots_), 0);
    if (speculate_) {
      TREX_CHECK(cfg.n_mtp == 1,
                 "cuda engine: speculative decoding with MTP needs a checkpoint with an MTP layer (config "
                 "num_nextn_predict_layers is {})",
                 cfg.n_mtp);
      TREX_CHECK(!weights || table_has_mtp(*weights),
                 "cuda engine: speculative decoding with MTP: the weights have no MTP module (mtp.0.*; load the "
                 "checkpoint with its MTP tensors)");
      mtp_ = make_gpu_mtp(cfg, weights, o.seed, o.moe_grouped_gemm);
      const int64_t W = mtp_->layer().dims.window, c = mtp_->layer().dims.head_dim;
      mtp_cache_.keys = zeroed(size_t(slots_ * W * c) * sizeof(bf16));
      mtp_cache_.cmp = mtp_cache_.keys.as<bf16>();
      mtp_cache_.win = mtp_cache_.cmp;
      xprev_ = zeroed(size_t(slots_ * 2 * cfg.hc_mult * cfg.hidden) * sizeof(bf16));
      spec_.assign(size_t(slots_), SlotSpec{});
    }
    reference_attention_ = o.reference_attention;
    prof_.on = o.profile;
    // The per-warp decode kernel serves head dims 256 / 512 only; the tensor-core path falls back to the generic
    // sparse attention for the others (the fixtures' 16 / 32 / 48).
    for (const auto& blk : m.blocks)
      TREX_CHECK(!reference_attention_ || cuda::sparse_attention_fast_head_dim(blk->dims.head_dim),
                 "cuda engine: the reference decode attention needs head dim 256 or 512 (model has {})",
                 blk->dims.head_dim);
    moe_grouped_max_tokens_ = o.per_expert_moe ? 0 : std::numeric_limits<int64_t>::max();
    TREX_CUDA(cudaDeviceSynchronize());
  }

  std::string name() const override { return "cuda"; }
  const dsv4::ModelConfig& config() const override { return cfg_; }
  int64_t slots() const override { return slots_; }
  int64_t max_context() const override { return max_context_; }
  int64_t slot_length(int64_t slot) const override {
    TREX_CHECK(slot >= 0 && slot < slots_, "cuda engine: slot {} out of range [0, {})", slot, slots_);
    return lengths_[size_t(slot)];
  }
  // Stale cache contents are never read: a step only reads rows and entries below the slot's length.
  void reset(int64_t slot) override {
    TREX_CHECK(slot >= 0 && slot < slots_, "cuda engine: slot {} out of range [0, {})", slot, slots_);
    lengths_[size_t(slot)] = 0;
    if (speculate_) spec_[size_t(slot)] = SlotSpec{};
  }
  void copy_slot(int64_t from, int64_t to) override;
  int64_t cache_bytes() const override;
  void forward(const std::vector<EngineFeed>& feeds, std::vector<float>& logits) override;
  void forward_greedy(const std::vector<EngineFeed>& feeds, std::vector<int32_t>& tokens) override;
  void forward_greedy_speculative(const std::vector<EngineFeed>& feeds, const std::vector<char>& decoding,
                                  std::vector<std::vector<int32_t>>& tokens) override;
  SpeculativeStats speculative_stats() const override { return stats_; }
  bool speculating() const override { return speculate_; }

 private:
  enum class Mode { Logits, Greedy, Speculative };
  StepPlan plan(const std::vector<EngineFeed>& feeds) const;
  // The step up to the head: device fp32 logits [feeds.size(), V] in step_ (null when there are no feeds), or with
  // head_rows the logits of those rows of the step instead. The final streams stay in step_X_.
  const float* run_step(const std::vector<EngineFeed>& feeds, const std::vector<int32_t>* head_rows = nullptr);
  // hc_head collapse -> norm -> fp32 logits [H, V] with the shared LM head, for H rows Xh [H, hc, d] (in step_).
  float* head_logits(const bf16* Xh, int64_t H, const float* fn, const float* base, const float* scale,
                     const bf16* norm);
  // A step with the MTP module (speculate_): see speculative.h.
  void speculative_step(const std::vector<EngineFeed>& feeds, Mode mode, std::vector<float>* logits,
                        std::vector<std::vector<int32_t>>* tokens, const std::vector<char>* decoding = nullptr);
  void attention(const dsv4gpu::GpuBlock& b, LayerCache& C, const StepPlan& P, const cuda::DecodeStep& st,
                 const int32_t* pos, const std::map<int64_t, std::pair<const int32_t*, const int32_t*>>& ent,
                 const bf16* a, bf16* y, Pool& tmp);

  dsv4::ModelConfig cfg_;
  int64_t slots_ = 0, max_context_ = 0;
  std::unique_ptr<dsv4gpu::GpuModel> model_;
  dsv4gpu::RopeDev rope_main_, rope_compress_;
  std::vector<LayerCache> caches_;
  std::vector<int64_t> lengths_;
  bool reference_attention_ = false;  // CudaEngineOptions::reference_attention: the per-warp decode kernel
  // Routed experts as one grouped GEMM (no host read of the expert counts) for steps of at most this many tokens,
  // else one cuBLASLt GEMM per expert after one host read per layer: every step is grouped, except with
  // CudaEngineOptions::per_expert_moe (the reference). The grouped GEMM is never slower (it has no host stall per
  // layer), so no step size is worth the per-expert path.
  int64_t moe_grouped_max_tokens_ = 0;
  dsv4gpu::DevLayout lay_;  // what moe_fwd reads of a step: N and the token ids (hash routing)
  Pool step_;               // the running step's buffers (freed stream-ordered when the next step starts)
  StepProfile prof_;
  bf16* step_X_ = nullptr;  // the last step's final streams [N, hc, d] (in step_)
  // Speculation (speculate_): the MTP module, its window ring, and per slot the main model's final streams of the
  // two candidate last positions of the last step ([slots, 2, hc, d]: the last fed token's, the draft's).
  bool speculate_ = false;
  std::unique_ptr<GpuMtp> mtp_;
  LayerCache mtp_cache_;
  DevMem xprev_;
  dsv4gpu::DevLayout mtp_lay_;
  // Per slot: the token the engine returned last (-1: none; the MTP's row of position length-1 assumed it), the
  // MTP's draft of the token after it (-1: none), and which xprev_ row holds position length-1.
  struct SlotSpec {
    int32_t guess = -1, draft = -1;
    int xsel = 0;
  };
  std::vector<SlotSpec> spec_;
  SpeculativeStats stats_;
};

// Slot `to` continues where `from` is (n > 1 sequences sharing a prompt): device copies of `from`'s cache regions
// in every layer (the compressed and indexer entries written so far, the whole window ring and partial-window rows;
// each slot owns a fixed region of every array), stream-ordered before the next step.
void CudaEngine::copy_slot(int64_t from, int64_t to) {
  TREX_CHECK(from >= 0 && from < slots_ && to >= 0 && to < slots_ && from != to,
             "cuda engine: cannot copy slot {} to slot {} (slots [0, {}))", from, to, slots_);
  const dsv4gpu::GpuModel::Impl& m = model_->impl();
  const int64_t L = lengths_[size_t(from)];
  auto copy = [&](void* base, int64_t per_slot, int64_t used) {  // bytes per slot, bytes to copy
    if (used <= 0) return;
    char* b = static_cast<char*>(base);
    TREX_CUDA(cudaMemcpyAsync(b + to * per_slot, b + from * per_slot, size_t(used), cudaMemcpyDeviceToDevice,
                              nullptr));
  };
  constexpr int64_t e = int64_t(sizeof(bf16));
  for (size_t l = 0; l < caches_.size(); ++l) {
    const dsv4::AttentionDims& D = m.blocks[l]->dims;
    LayerCache& C = caches_[l];
    const int64_t c = D.head_dim;
    copy(C.win, D.window * c * e, D.window * c * e);
    if (D.type == dsv4::AttnType::Sliding) continue;
    const bool csa = D.type == dsv4::AttnType::CSA;
    const int64_t w = csa ? 2 : 1, entries = std::min(L / D.ratio, C.cap);
    copy(C.cmp, C.cap * c * e, entries * c * e);
    copy(C.ckv.as<bf16>(), C.rows * w * c * e, C.rows * w * c * e);
    copy(C.cgate.as<bf16>(), C.rows * w * c * e, C.rows * w * c * e);
    if (!csa) continue;
    const int64_t cI = D.index_head_dim;
    copy(C.ikeys.as<bf16>(), std::max<int64_t>(C.cap, 1) * cI * e, entries * cI * e);
    copy(C.ikv.as<bf16>(), 2 * D.ratio * 2 * cI * e, 2 * D.ratio * 2 * cI * e);
    copy(C.igate.as<bf16>(), 2 * D.ratio * 2 * cI * e, 2 * D.ratio * 2 * cI * e);
  }
  if (speculate_) {  // the MTP's window ring, the kept final streams and the draft follow the slot
    const int64_t W = mtp_->layer().dims.window, c = mtp_->layer().dims.head_dim, X = 2 * cfg_.hc_mult * cfg_.hidden;
    copy(mtp_cache_.win, W * c * e, W * c * e);
    copy(xprev_.as<bf16>(), X * e, X * e);
    spec_[size_t(to)] = spec_[size_t(from)];
  }
  lengths_[size_t(to)] = L;
}

int64_t CudaEngine::cache_bytes() const {
  // Bytes of cache state the slots' current lengths use (the arrays are allocated for max_context up front).
  const dsv4gpu::GpuModel::Impl& m = model_->impl();
  int64_t b = 0;
  for (int64_t s = 0; s < slots_; ++s) {
    const int64_t L = lengths_[size_t(s)];
    if (L == 0) continue;
    for (size_t l = 0; l < caches_.size(); ++l) {
      const dsv4::AttentionDims& D = m.blocks[l]->dims;
      b += std::min(L, D.window) * D.head_dim;
      if (D.type == dsv4::AttnType::Sliding) continue;
      const bool csa = D.type == dsv4::AttnType::CSA;
      b += (L / D.ratio) * D.head_dim + 2 * caches_[l].rows * (csa ? 2 : 1) * D.head_dim;
      if (csa) b += (L / D.ratio) * D.index_head_dim + 2 * (2 * D.ratio) * 2 * D.index_head_dim;
    }
  }
  return b * int64_t(sizeof(bf16));
}

StepPlan CudaEngine::plan(const std::vector<EngineFeed>& feeds) const {
  StepPlan P;
  std::set<int64_t> seen;
  P.begin.push_back(0);
  std::set<int64_t> ratios;
  for (int64_t r : cfg_.compress_ratio)
    if (r > 0) ratios.insert(r);
  for (size_t it = 0; it < feeds.size(); ++it) {
    const EngineFeed& f = feeds[it];
    TREX_CHECK(f.slot >= 0 && f.slot < slots_, "cuda engine: slot {} out of range [0, {})", f.slot, slots_);
    TREX_CHECK(f.n >= 1 && f.ids != nullptr, "cuda engine: feed {} (slot {}) has no tokens", it, f.slot);
    TREX_CHECK(seen.insert(f.slot).second, "cuda engine: slot {} appears twice in one step", f.slot);
    const int64_t len = lengths_[size_t(f.slot)];
    TREX_CHECK(len + f.n <= max_context_,
               "cuda engine: slot {} has {} tokens; {} more would exceed the context limit of {} tokens", f.slot, len,
               f.n, max_context_);
    for (int64_t j = 0; j < f.n; ++j) {
      TREX_CHECK(f.ids[j] >= 0 && f.ids[j] < cfg_.vocab_size,
                 "cuda engine: token id {} (slot {}, token {}) outside [0, {})", f.ids[j], f.slot, j, cfg_.vocab_size);
      P.ids.push_back(f.ids[j]);
      P.pos.push_back(int32_t(len + j));
      P.item.push_back(int32_t(it));
    }
    P.slot.push_back(int32_t(f.slot));
    P.first.push_back(int32_t(len));
    P.begin.push_back(int32_t(P.ids.size()));
    for (int64_t m : ratios) {
      auto& [items, idx] = P.entries[m];
      for (int64_t e = len / m; e < (len + f.n) / m; ++e) items.push_back(int32_t(it)), idx.push_back(int32_t(e));
      P.max_visible[m] = std::max(P.max_visible[m], (len + f.n) / m);
    }
  }
  return P;
}

void CudaEngine::attention(const dsv4gpu::GpuBlock& b, LayerCache& C, const StepPlan& P, const cuda::DecodeStep& st,
                           const int32_t* pos,
                           const std::map<int64_t, std::pair<const int32_t*, const int32_t*>>& ent, const bf16* a,
                           bf16* y, Pool& tmp) {
  dsv4gpu::GpuModel::Impl& m = model_->impl();
  const dsv4::AttentionDims& D = b.dims;
  const dsv4gpu::AttnW& w = b.aw;
  const dsv4gpu::Linear lin{&m.gemm};
  const int64_t N = st.n_tok, d = D.d, H = D.n_heads, hd = D.head_dim, r = D.rope_dim, dc = D.d_c;
  const int64_t G = D.o_groups, hg = H / G, gd = G * D.o_rank;
  const float eps = float(D.eps);
  const bool compressed = D.type != dsv4::AttnType::Sliding, csa = D.type == dsv4::AttnType::CSA;
  const dsv4gpu::RopeDev& rope = compressed ? rope_compress_ : rope_main_;
  auto rargs = [&](int64_t rows, int64_t heads, int64_t c, const int32_t* p, int sign) {
    cuda::RopeArgs ra;
    ra.rows = rows, ra.heads = heads, ra.c = c, ra.rope_dim = r, ra.pos = p;
    ra.cos = rope.cos.as<float>(), ra.sin = rope.sin.as<float>(), ra.sign = sign;
    return ra;
  };

  // Query path and the shared K=V row (the training forward's ops).
  bf16* qa = tmp.take<bf16>(N * dc);
  bf16* cq = tmp.take<bf16>(N * dc);
  float* rstd = tmp.take<float>(N * H);
  lin.fwd(qa, a, w.wq_a, N, d, dc);
  cuda::rmsnorm_fwd(cq, rstd, qa, w.q_norm, N, dc, eps);
  bf16* q_pre = tmp.take<bf16>(N * H * hd);
  bf16* q = tmp.take<bf16>(N * H * hd);
  lin.fwd(q_pre, cq, w.wq_b, N, dc, H * hd);
  cuda::rmsnorm_fwd(q, rstd, q_pre, nullptr, N * H, hd, eps);
  cuda::rope_apply(q, rargs(N, H, hd, pos, +1));
  bf16* kvp = tmp.take<bf16>(N * hd);
  bf16* kv = tmp.take<bf16>(N * hd);
  lin.fwd(kvp, a, w.wkv, N, d, hd);
  cuda::rmsnorm_fwd(kv, rstd, kvp, w.kv_norm, N, hd, eps);
  cuda::rope_apply(kv, rargs(N, 1, hd, pos, +1));

  // Compressors: this step's completed entries, then the rows still needed by later entries.
  auto compress = [&](const bf16* wkv, const bf16* wgate, const float* ape, const bf16* norm, int64_t c, bool overlap,
                      int64_t rows, DevMem& ring_kv, DevMem& ring_gate, bf16* entries) {
    const int64_t width = (overlap ? 2 : 1) * c;
    bf16* skv = tmp.take<bf16>(N * width);
    bf16* sgate = tmp.take<bf16>(N * width);
    lin.fwd(skv, a, wkv, N, d, width);
    lin.fwd(sgate, a, wgate, N, d, width);
    const auto& [items, idx] = ent.at(D.ratio);
    cuda::DecodeCompress dcmp;
    dcmp.n_entries = int64_t(P.entries.at(D.ratio).first.size());
    dcmp.entry_item = items, dcmp.entry_idx = idx;
    dcmp.ratio = D.ratio, dcmp.c = c, dcmp.overlap = overlap, dcmp.rows = rows;
    dcmp.step_kv = skv, dcmp.step_gate = sgate;
    dcmp.ring_kv = ring_kv.as<bf16>(), dcmp.ring_gate = ring_gate.as<bf16>();
    dcmp.ape = ape, dcmp.norm = norm, dcmp.eps = eps, dcmp.rope_dim = r;
    dcmp.cos = rope.cos.as<float>(), dcmp.sin = rope.sin.as<float>();
    dcmp.cap = C.cap, dcmp.entries = entries;
    cuda::decode_compress_entries(st, dcmp);
    cuda::decode_store_rows(st, ring_kv.as<bf16>(), skv, rows, width);
    cuda::decode_store_rows(st, ring_gate.as<bf16>(), sgate, rows, width);
  };
  int64_t* sel = nullptr;
  if (compressed) {
    compress(w.cmp_wkv, w.cmp_wgate, w.cmp_ape, w.cmp_norm, hd, csa, C.rows, C.ckv, C.cgate, C.cmp);
    if (csa) {
      const int64_t nI = D.index_heads, cI = D.index_head_dim, k = D.index_topk;
      compress(w.idx_wkv, w.idx_wgate, w.idx_ape, w.idx_norm, cI, true, 2 * D.ratio, C.ikv, C.igate,
               C.ikeys.as<bf16>());
      bf16* iq = tmp.take<bf16>(N * nI * cI);
      lin.fwd(iq, cq, w.idx_wq_b, N, dc, nI * cI);
      cuda::rope_apply(iq, rargs(N, nI, cI, pos, +1));
      float* iw = tmp.take<float>(N * nI);
      lin.fwd(iw, a, w.idx_wp, N, d, nI, true);
      int64_t* vb = tmp.take<int64_t>(N);
      int64_t* ve = tmp.take<int64_t>(N);
      cuda::decode_visible_ranges(st, D.ratio, C.cap, vb, ve);
      sel = tmp.take<int64_t>(N * k);
      cuda::IndexerTopkArgs ia;
      ia.n_tok = N, ia.n_heads = nI, ia.head_dim = cI, ia.k_sel = k;
      ia.max_visible = std::max<int64_t>(P.max_visible.at(D.ratio), 1);
      ia.w_scale = float(1.0 / std::sqrt(double(nI)));
      ia.vis_begin = vb, ia.vis_end = ve;
      cuda::indexer_topk(sel, iq, iw, C.ikeys.as<bf16>(), ia);
    }
  }

  prof_.mark(2);
  // Core attention against the caches, then the window ring takes the newest rows.
  bf16* o = tmp.take<bf16>(N * H * hd);
  if (reference_attention_) {  // the per-warp decode kernel (CudaEngineOptions::reference_attention)
    cuda::DecodeAttention da;
    da.heads = H, da.c = hd, da.scale = float(1.0 / std::sqrt(double(hd)));
    da.q = q, da.kv = kv, da.win = C.win, da.window = D.window;
    if (compressed) da.cmp = C.cmp, da.cap = C.cap, da.ratio = D.ratio;
    if (csa) da.sel = sel, da.k_sel = D.index_topk;
    da.sink = w.sink, da.o = o;
    cuda::decode_attention(st, da);
  } else {
    // The training tensor-core kernel: window rows of this step from the step's kv, older window rows and the
    // compressed entries as selected rows of the layer's key array. Column counts are this step's maxima (a
    // prompt chunk on an empty slot has no history columns; CSA's indexer leaves at most max_visible valid).
    cuda::DecodeKeySets ks;
    ks.window = D.window, ks.ring_base = slots_ * C.cap;
    for (int32_t f : P.first) ks.n_hist = std::max<int64_t>(ks.n_hist, std::min<int64_t>(f, D.window - 1));
    if (compressed) {
      const int64_t vis = P.max_visible.at(D.ratio);
      ks.n_cmp = csa ? std::min<int64_t>(D.index_topk, vis) : vis;
      ks.cap = C.cap, ks.ratio = D.ratio;
      if (csa) ks.sel = sel, ks.k_sel = D.index_topk;
    }
    const int64_t cols = ks.n_hist + ks.n_cmp;
    ks.win_begin = tmp.take<int64_t>(N);
    if (cols > 0) ks.cols = tmp.take<int64_t>(N * cols);
    cuda::decode_key_sets(st, ks);
    cuda::SparseKeySets keys;
    keys.win_begin = ks.win_begin;
    if (cols > 0) keys.cmp_sel = ks.cols, keys.k_sel = cols;
    float* lse = tmp.take<float>(N * H);
    if (cuda::sparse_attention_fast_head_dim(hd))
      cuda::sparse_attention_fwd(q, kv, C.keys.as<bf16>(), w.sink, N, H, hd, keys, o, lse);
    else  // the golden fixtures' small head dims, as in the training forward
      cuda::sparse_attention_generic_fwd(q, kv, C.keys.as<bf16>(), w.sink, N, H, hd, keys, o, lse);
  }
  cuda::decode_store_rows(st, C.win, kv, D.window, hd);
  prof_.mark(3);

  // Inverse RoPE and the grouped output projection, as in the training forward.
  cuda::rope_apply(o, rargs(N, H, hd, pos, -1));
  bf16* og = q_pre;  // free again: [N, H*hd]
  cuda::permute_groups(og, o, N, G, hg * hd, true);
  bf16* rg = tmp.take<bf16>(N * gd);
  cuda::GemmShape gs{N, D.o_rank, hg * hd, false, true, cuda::GemmType::BF16, cuda::GemmType::BF16, G};
  m.gemm.run(gs, og, w.wo_a, rg);
  bf16* rr = tmp.take<bf16>(N * gd);
  cuda::permute_groups(rr, rg, N, G, D.o_rank, false);
  lin.fwd(y, rr, w.wo_b, N, gd, d);
}

void CudaEngine::forward(const std::vector<EngineFeed>& feeds, std::vector<float>& logits) {
  logits.clear();
  if (speculate_) return speculative_step(feeds, Mode::Logits, &logits, nullptr);
  const float* dlog = run_step(feeds);
  if (!dlog) return;
  logits.resize(feeds.size() * size_t(cfg_.vocab_size));
  TREX_CUDA(cudaMemcpy(logits.data(), dlog, logits.size() * sizeof(float), cudaMemcpyDeviceToHost));
  prof_.mark(7);
  prof_.end();
}

void CudaEngine::forward_greedy(const std::vector<EngineFeed>& feeds, std::vector<int32_t>& tokens) {
  tokens.clear();
  if (speculate_) {
    std::vector<std::vector<int32_t>> t;
    speculative_step(feeds, Mode::Greedy, nullptr, &t);
    for (const auto& v : t) tokens.push_back(v.front());
    return;
  }
  const float* dlog = run_step(feeds);
  if (!dlog) return;
  int32_t* dtok = step_.take<int32_t>(int64_t(feeds.size()));
  cuda::decode_argmax_rows(dlog, int64_t(feeds.size()), cfg_.vocab_size, dtok);
  tokens.resize(feeds.size());
  TREX_CUDA(cudaMemcpy(tokens.data(), dtok, tokens.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  prof_.mark(7);
  prof_.end();
}

// One step with the MTP module (speculative.h). Host plan first (nothing changes before the main step validates the
// feeds), then on the stream: the main step (a decode feed whose token is the one returned last runs with the draft
// as a second token), the head on the fed last rows and the draft rows, device argmax, the MTP block over the
// positions whose next token is now known, the MTP's picks of the candidate last rows, one copy back; the host then
// accepts or rejects each draft and keeps the slot's counters.
//
// The MTP's row of position p needs the main model's final streams at p and the token at p + 1. Positions below
// length - 1 always have theirs; the row of position length - 1 was built with the token the engine returned
// (guess), so a step whose first fed token differs (a sampled pick, another prompt chunk) builds it again from the
// kept streams (xprev_). A rejected draft's rows in the main caches and the MTP ring lie at position >= the
// length and are rewritten by the next step before any read (see speculative.h), so rejection only does not count
// the position.
void CudaEngine::speculative_step(const std::vector<EngineFeed>& feeds, Mode mode, std::vector<float>* logits,
                                  std::vector<std::vector<int32_t>>* tokens, const std::vector<char>* decoding) {
  const int64_t F = int64_t(feeds.size()), hc = cfg_.hc_mult, d = cfg_.hidden, V = cfg_.vocab_size;
  if (tokens) tokens->assign(size_t(F), {});
  if (feeds.empty()) return;
  for (const EngineFeed& f : feeds)  // the first token is read below, before plan() checks the rest
    TREX_CHECK(f.slot >= 0 && f.slot < slots_ && f.n >= 1 && f.ids != nullptr,
               "cuda engine: feed of slot {} is invalid (slot range [0, {}), {} tokens)", f.slot, slots_, f.n);
  // The main step's feeds: a verified draft appended where there is one.
  std::vector<std::vector<int32_t>> ids(static_cast<size_t>(F));
  std::vector<EngineFeed> step_feeds(static_cast<size_t>(F));
  std::vector<char> verify(static_cast<size_t>(F), 0);
  std::vector<int32_t> head_rows;  // per feed: its last fed row, then the draft's row when verifying
  std::vector<int32_t> head_of(static_cast<size_t>(F));
  int64_t row = 0;
  for (int64_t k = 0; k < F; ++k) {
    const EngineFeed& f = feeds[size_t(k)];
    const SlotSpec& sp = spec_[size_t(f.slot)];
    const int64_t L = lengths_[size_t(f.slot)];
    ids[size_t(k)].assign(f.ids, f.ids + f.n);
    verify[size_t(k)] = mode == Mode::Speculative && (*decoding)[size_t(k)] && f.n == 1 && sp.draft >= 0 &&
                        sp.guess == f.ids[0] && L + 2 <= max_context_;
    if (verify[size_t(k)]) ids[size_t(k)].push_back(sp.draft);
    step_feeds[size_t(k)] = EngineFeed{f.slot, ids[size_t(k)].data(), int64_t(ids[size_t(k)].size())};
    head_of[size_t(k)] = int32_t(head_rows.size());
    head_rows.push_back(int32_t(row + f.n - 1));
    if (verify[size_t(k)]) head_rows.push_back(int32_t(row + f.n));
    row += step_feeds[size_t(k)].n;
  }
  // The MTP step's plan: per feed the positions [start, end) with their source rows (>= 0: this step's row, < 0:
  // xprev_ row -code-1) and next tokens (>= 0: the id, < 0: main pick -code-1), and its candidate rows.
  StepPlan Q;
  Q.begin.push_back(0);
  std::vector<int32_t> src, next, mtp_head;
  std::vector<int32_t> cand(size_t(2 * F), -1);  // per feed: MTP head index of the last fed / the draft position
  row = 0;
  for (int64_t k = 0; k < F; ++k) {
    const EngineFeed& f = feeds[size_t(k)];
    const SlotSpec& sp = spec_[size_t(f.slot)];
    const int64_t L = lengths_[size_t(f.slot)], n = f.n;
    const int64_t start = (L >= 1 && sp.guess != f.ids[0]) ? L - 1 : L;
    const int64_t q0 = int64_t(src.size());
    for (int64_t p = start; p < L + n - 1; ++p) {
      Q.pos.push_back(int32_t(p));
      src.push_back(p == L - 1 ? -(2 * int32_t(f.slot) + sp.xsel) - 1 : int32_t(row + (p - L)));
      next.push_back(p == L - 1 ? f.ids[0] : f.ids[p - L + 1]);
    }
    if (mode != Mode::Logits) {
      cand[size_t(2 * k)] = int32_t(mtp_head.size());
      mtp_head.push_back(int32_t(src.size()));
      Q.pos.push_back(int32_t(L + n - 1));
      src.push_back(int32_t(row + n - 1));
      next.push_back(-head_of[size_t(k)] - 1);
      if (verify[size_t(k)]) {
        cand[size_t(2 * k + 1)] = int32_t(mtp_head.size());
        mtp_head.push_back(int32_t(src.size()));
        Q.pos.push_back(int32_t(L + n));
        src.push_back(int32_t(row + n));
        next.push_back(-(head_of[size_t(k)] + 1) - 1);
      }
    }
    const int64_t cnt = int64_t(src.size()) - q0;
    if (cnt > 0) {
      for (int64_t j = 0; j < cnt; ++j) Q.item.push_back(int32_t(Q.slot.size()));
      Q.slot.push_back(int32_t(f.slot));
      Q.first.push_back(int32_t(start));
      Q.begin.push_back(int32_t(src.size()));
    }
    row += step_feeds[size_t(k)].n;
  }

  // Main step (validates every feed before any state changes), head on head_rows.
  const float* dlog = run_step(step_feeds, &head_rows);
  const int64_t Hm = int64_t(head_rows.size()), Hq = int64_t(mtp_head.size()), Nq = int64_t(src.size());
  Pool& step = step_;
  int32_t* picks = step.take<int32_t>(Hm + Hq);  // main picks, then the MTP's
  if (mode != Mode::Logits) cuda::decode_argmax_rows(dlog, Hm, V, picks);
  dsv4gpu::GpuModel::Impl& m = model_->impl();
  dsv4gpu::GpuModel::Impl& mm = mtp_->block->impl();
  if (Nq > 0) {
    std::vector<int32_t> host;
    auto put = [&](const std::vector<int32_t>& v) {
      const size_t at = host.size();
      host.insert(host.end(), v.begin(), v.end());
      return at;
    };
    const size_t o_pos = put(Q.pos), o_item = put(Q.item), o_slot = put(Q.slot), o_first = put(Q.first),
                 o_begin = put(Q.begin), o_src = put(src), o_next = put(next), o_head = put(mtp_head);
    int32_t* dev = step.take<int32_t>(int64_t(host.size()));
    TREX_CUDA(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, nullptr));
    cuda::DecodeStep st;
    st.n_tok = Nq, st.n_items = int64_t(Q.slot.size());
    st.tok_pos = dev + o_pos, st.tok_item = dev + o_item, st.item_slot = dev + o_slot;
    st.item_first = dev + o_first, st.item_begin = dev + o_begin;
    // Input streams: h_proj(hnorm(X_p)) per stream + e_proj(enorm(Embed[token p+1])).
    mtp_lay_.N = Nq, mtp_lay_.B = 1, mtp_lay_.S = Nq;
    mtp_lay_.ids = DevMem(size_t(Nq) * sizeof(int32_t));
    int32_t* nid = mtp_lay_.ids.as<int32_t>();
    cuda::resolve_token_ids(nid, dev + o_next, picks, Nq);
    const dsv4gpu::Linear lin{&m.gemm};
    const float eps = float(cfg_.rms_eps);
    bf16* emb = step.take<bf16>(Nq * d);
    bf16* en = step.take<bf16>(Nq * d);
    bf16* e = step.take<bf16>(Nq * d);
    float* rs = step.take<float>(Nq * hc);
    cuda::embed_streams_fwd(emb, nid, m.b16("embed.weight"), Nq, d, 1);
    cuda::rmsnorm_fwd(en, rs, emb, mtp_->enorm.as<bf16>(), Nq, d, eps);
    lin.fwd(e, en, mtp_->e_proj.as<bf16>(), Nq, d, d);
    bf16* xin = step.take<bf16>(Nq * hc * d);
    bf16* hn = step.take<bf16>(Nq * hc * d);
    bf16* X = step.take<bf16>(Nq * hc * d);
    bf16* Xmid = step.take<bf16>(Nq * hc * d);
    cuda::copy_rows_bf16(xin, nullptr, step_X_, xprev_.as<bf16>(), dev + o_src, Nq, hc * d);
    cuda::rmsnorm_fwd(hn, rs, xin, mtp_->hnorm.as<bf16>(), Nq * hc, d, eps);
    lin.fwd(X, hn, mtp_->h_proj.as<bf16>(), Nq * hc, d, d);
    cuda::add_to_streams_bf16(X, e, Nq, hc, d);
    // The MTP block, as a main layer (its own window ring).
    dsv4gpu::GpuBlock& b = mtp_->layer();
    cuda::MhcDims md;
    md.n_tok = Nq, md.d = d, md.sinkhorn_iters = int(cfg_.hc_sinkhorn_iters);
    md.hc_eps = float(cfg_.hc_eps), md.rms_eps = eps;
    auto site_acts = [&]() {
      cuda::MhcActs a;
      a.mix = step.take<float>(Nq * cuda::kMhcMix), a.rstd = step.take<float>(Nq), a.pre = step.take<float>(Nq * 4);
      a.post = step.take<float>(Nq * 4), a.comb = step.take<float>(Nq * 16);
      return a;
    };
    const cuda::MhcActs sa = site_acts(), sf = site_acts();
    bf16* an = step.take<bf16>(Nq * d);
    bf16* y = step.take<bf16>(Nq * d);
    float* rstd = step.take<float>(Nq);
    Pool tmp;
    cuda::mhc_site_norm_fwd_any(hc, md, X, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, sa, b.attn_norm, eps, an,
                                rstd);
    attention(b, mtp_cache_, Q, st, dev + o_pos, {}, an, y, tmp);
    cuda::mhc_expand_fwd_any(hc, md, X, y, sa.post, sa.comb, Xmid);
    cuda::mhc_site_norm_fwd_any(hc, md, Xmid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, sf, b.ffn_norm, eps, an,
                                rstd);
    dsv4gpu::Ctx c;
    c.cfg = &cfg_, c.gemm = &m.gemm, c.lin = lin, c.lay = &mtp_lay_;
    c.rope_main = &rope_main_, c.rope_compress = &rope_compress_;
    c.grouped_experts = Nq <= moe_grouped_max_tokens_;
    b.keep.clear();
    b.u = an, b.y_f = y;
    dsv4gpu::moe_fwd(c, b, nullptr);
    cuda::mhc_expand_fwd_any(hc, md, Xmid, y, sf.post, sf.comb, X);
    b.keep.clear();
    if (Hq > 0) {
      bf16* Xh = step.take<bf16>(Hq * hc * d);
      cuda::copy_rows_bf16(Xh, nullptr, X, nullptr, dev + o_head, Hq, hc * d);
      const float* mlog = head_logits(Xh, Hq, mm.f32("hc_head_fn"), mm.f32("hc_head_base"), mm.f32("hc_head_scale"),
                                      mm.b16("norm.weight"));
      cuda::decode_argmax_rows(mlog, Hq, V, picks + Hm);
    }
  }
  // Keep the final streams of the candidate last rows per slot (after the MTP read the old ones).
  {
    std::vector<int32_t> dst, from;
    for (int64_t k = 0; k < F; ++k) {
      const int32_t s = int32_t(feeds[size_t(k)].slot);
      dst.push_back(2 * s), from.push_back(head_rows[size_t(head_of[size_t(k)])]);
      if (verify[size_t(k)]) dst.push_back(2 * s + 1), from.push_back(head_rows[size_t(head_of[size_t(k)]) + 1]);
    }
    std::vector<int32_t> host(dst);
    host.insert(host.end(), from.begin(), from.end());
    int32_t* dev = step.take<int32_t>(int64_t(host.size()));
    TREX_CUDA(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, nullptr));
    cuda::copy_rows_bf16(xprev_.as<bf16>(), dev, step_X_, nullptr, dev + dst.size(), int64_t(dst.size()), hc * d);
  }
  std::vector<int32_t> got(size_t(Hm + Hq));
  if (mode == Mode::Logits) {
    logits->resize(size_t(F * V));
    TREX_CUDA(cudaMemcpy(logits->data(), dlog, logits->size() * sizeof(float), cudaMemcpyDeviceToHost));
  } else {
    TREX_CUDA(cudaMemcpy(got.data(), picks, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  }
  prof_.mark(7);
  prof_.end();
  bool any_verify = false;
  for (int64_t k = 0; k < F; ++k) {
    const int64_t slot = feeds[size_t(k)].slot;
    SlotSpec& sp = spec_[size_t(slot)];
    if (mode == Mode::Logits) {
      sp = SlotSpec{};
      continue;
    }
    const int32_t g0 = got[size_t(head_of[size_t(k)])];
    std::vector<int32_t>& out = (*tokens)[size_t(k)];
    out.push_back(g0);
    sp.xsel = 0;
    sp.draft = got[size_t(Hm + cand[size_t(2 * k)])];
    if (verify[size_t(k)]) {
      any_verify = true;
      ++stats_.drafted;
      if (ids[size_t(k)].back() == g0) {  // accepted: the draft's position counts, its pick follows
        ++stats_.accepted;
        out.push_back(got[size_t(head_of[size_t(k)]) + 1]);
        sp.xsel = 1;
        sp.draft = got[size_t(Hm + cand[size_t(2 * k + 1)])];
      } else {
        lengths_[size_t(slot)] -= 1;  // the rejected draft's position is not part of the sequence
      }
    }
    sp.guess = out.back();
  }
  stats_.verify_steps += any_verify;
}

void CudaEngine::forward_greedy_speculative(const std::vector<EngineFeed>& feeds, const std::vector<char>& decoding,
                                            std::vector<std::vector<int32_t>>& tokens) {
  tokens.clear();
  TREX_CHECK(decoding.size() == feeds.size(), "cuda engine: {} decoding flags for {} feeds", decoding.size(),
             feeds.size());
  if (!speculate_) {  // plain: one token per feed
    std::vector<int32_t> t;
    forward_greedy(feeds, t);
    for (int32_t v : t) tokens.push_back({v});
    return;
  }
  speculative_step(feeds, Mode::Speculative, nullptr, &tokens, &decoding);
}

float* CudaEngine::head_logits(const bf16* Xh, int64_t H, const float* fn, const float* base, const float* scale,
                               const bf16* norm) {
  dsv4gpu::GpuModel::Impl& m = model_->impl();
  const int64_t hc = cfg_.hc_mult, d = cfg_.hidden, V = cfg_.vocab_size;
  Pool& step = step_;
  bf16* hcol = step.take<bf16>(H * d);
  bf16* hn = step.take<bf16>(H * d);
  float* hmix = step.take<float>(H * 4);
  float* hrstd = step.take<float>(H);
  float* hw = step.take<float>(H * 4);
  cuda::hc_head_fwd_any(hc, hcol, hmix, hrstd, hw, Xh, fn, base, scale, H, d, float(cfg_.hc_eps), float(cfg_.rms_eps));
  cuda::rmsnorm_fwd(hn, hrstd, hcol, norm, H, d, float(cfg_.rms_eps));
  float* dlog = step.take<float>(H * V);
  dsv4gpu::Linear{&m.gemm}.fwd(dlog, hn, m.b16("head.weight"), H, d, V, true);
  return dlog;
}

const float* CudaEngine::run_step(const std::vector<EngineFeed>& feeds, const std::vector<int32_t>* head_rows) {
  const StepPlan P = plan(feeds);  // validates before any state changes
  if (P.ids.empty()) return nullptr;
  step_.clear();
  if (prof_.on) {
    bool decode = true;
    for (const EngineFeed& f : feeds) decode = decode && f.n == 1;
    prof_.begin(decode ? fmt::format("decode N={:3d}", feeds.size())
                       : fmt::format("prefill/mixed ~{:5d} tokens", cuda::Gemm::extent_class(int64_t(P.ids.size()))),
                &model_->impl().gemm);
  }
  dsv4gpu::GpuModel::Impl& m = model_->impl();
  const int64_t N = int64_t(P.ids.size()), I = int64_t(P.slot.size()), d = cfg_.hidden, hc = cfg_.hc_mult;

  // One upload of every int32 array of the step.
  std::vector<int32_t> host;
  auto put = [&](const std::vector<int32_t>& v) {
    const size_t at = host.size();
    host.insert(host.end(), v.begin(), v.end());
    return at;
  };
  const size_t o_ids = put(P.ids), o_pos = put(P.pos), o_item = put(P.item), o_slot = put(P.slot),
               o_first = put(P.first), o_begin = put(P.begin);
  std::map<int64_t, std::pair<size_t, size_t>> o_ent;
  for (const auto& [r, e] : P.entries) o_ent[r] = {put(e.first), put(e.second)};
  const size_t o_head = head_rows ? put(*head_rows) : 0;
  Pool& step = step_;
  int32_t* dev = step.take<int32_t>(int64_t(host.size()));
  TREX_CUDA(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, nullptr));
  cuda::DecodeStep st;
  st.n_tok = N, st.n_items = I;
  st.tok_pos = dev + o_pos, st.tok_item = dev + o_item, st.item_slot = dev + o_slot;
  st.item_first = dev + o_first, st.item_begin = dev + o_begin;
  std::map<int64_t, std::pair<const int32_t*, const int32_t*>> ent;
  for (const auto& [r, o] : o_ent) ent[r] = {dev + o.first, dev + o.second};
  lay_.N = N, lay_.B = 1, lay_.S = N;
  lay_.ids = DevMem(size_t(N) * sizeof(int32_t));
  TREX_CUDA(cudaMemcpyAsync(lay_.ids.as<int32_t>(), dev + o_ids, size_t(N) * sizeof(int32_t),
                            cudaMemcpyDeviceToDevice, nullptr));

  dsv4gpu::Ctx c;
  c.cfg = &cfg_, c.gemm = &m.gemm, c.lin = dsv4gpu::Linear{&m.gemm}, c.lay = &lay_;
  c.rope_main = &rope_main_, c.rope_compress = &rope_compress_;
  c.grouped_experts = N <= moe_grouped_max_tokens_;
  cuda::MhcDims md;
  md.n_tok = N, md.d = d, md.sinkhorn_iters = int(cfg_.hc_sinkhorn_iters);
  md.hc_eps = float(cfg_.hc_eps), md.rms_eps = float(cfg_.rms_eps);
  auto site_acts = [&](Pool& p) {
    cuda::MhcActs s;
    s.mix = p.take<float>(N * cuda::kMhcMix), s.rstd = p.take<float>(N), s.pre = p.take<float>(N * 4);
    s.post = p.take<float>(N * 4), s.comb = p.take<float>(N * 16);
    return s;
  };
  bf16* X = step.take<bf16>(N * hc * d);
  bf16* Xmid = step.take<bf16>(N * hc * d);
  bf16* an = step.take<bf16>(N * d);
  bf16* y = step.take<bf16>(N * d);
  float* rstd = step.take<float>(N);
  const cuda::MhcActs sa = site_acts(step), sf = site_acts(step);
  // mHC site + the RMSNorm after it on the fp32 collapse, as the training forward does (the same numbers as the
  // uncached model): one fused kernel for 4 streams, the generic site + collapse-norm otherwise.
  auto site_norm = [&](const bf16* Xs, const float* fn, const float* base, const float* scale, const cuda::MhcActs& a,
                       const bf16* norm_w) {
    cuda::mhc_site_norm_fwd_any(hc, md, Xs, fn, base, scale, a, norm_w, float(cfg_.rms_eps), an, rstd);
  };
  cuda::embed_streams_fwd(X, dev + o_ids, m.b16("embed.weight"), N, d, hc);
  prof_.mark(0);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    dsv4gpu::GpuBlock& b = *m.blocks[size_t(l)];
    Pool tmp;
    site_norm(X, b.hc_attn_fn, b.hc_attn_base, b.hc_attn_scale, sa, b.attn_norm);
    prof_.mark(1);
    attention(b, caches_[size_t(l)], P, st, dev + o_pos, ent, an, y, tmp);
    prof_.mark(4);
    cuda::mhc_expand_fwd_any(hc, md, X, y, sa.post, sa.comb, Xmid);
    site_norm(Xmid, b.hc_ffn_fn, b.hc_ffn_base, b.hc_ffn_scale, sf, b.ffn_norm);
    prof_.mark(1);
    b.keep.clear();
    b.u = an, b.y_f = y;
    dsv4gpu::moe_fwd(c, b, nullptr);
    prof_.mark(5);
    cuda::mhc_expand_fwd_any(hc, md, Xmid, y, sf.post, sf.comb, X);
    b.keep.clear();
    prof_.mark(1);
  }
  for (size_t it = 0; it < feeds.size(); ++it) lengths_[size_t(feeds[it].slot)] += feeds[it].n;

  step_X_ = X;
  // Head on each feed's last token (or on head_rows).
  const int64_t H = head_rows ? int64_t(head_rows->size()) : I;
  bf16* Xh = step.take<bf16>(H * hc * d);
  if (head_rows)
    cuda::copy_rows_bf16(Xh, nullptr, X, nullptr, dev + o_head, H, hc * d);
  else
    cuda::decode_last_rows(st, X, hc * d, Xh);
  float* dlog = head_logits(Xh, H, m.f32("hc_head_fn"), m.f32("hc_head_base"), m.f32("hc_head_scale"),
                            m.b16("norm.weight"));
  prof_.mark(6);
  return dlog;
}

}  // namespace

std::unique_ptr<Engine> make_cuda_engine(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                         const CudaEngineOptions& opts) {
  return std::make_unique<CudaEngine>(cfg, weights, opts, false);
}

std::unique_ptr<Engine> make_cuda_engine(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                         const CudaEngineOptions& opts, bool speculative_mtp) {
  return std::make_unique<CudaEngine>(cfg, weights, opts, speculative_mtp);
}

}  // namespace trex::infer
