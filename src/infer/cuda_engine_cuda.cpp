// The CUDA engine: the Engine interface (engine.h) on one GPU. Weights are the GPU model's bf16 compute copy
// (model/cuda/gpu_model.h, built for inference: no gradients; random by seed or loaded from a CPU parameter table).
// A step is the block program's decode pass (model/dsv4/program.h) over the GPU model's CUDA backend
// (model/cuda/cuda_backend.h): every new token of every feed batched through the embedding, each block's mHC
// sites, attention against the slots' caches and MoE, and the head on the rows asked for. The backend owns the
// slots' device caches (model/cuda/decode_cache.h); this file keeps the engine's concerns: the slots and their
// lengths, feed validation, greedy picks on the device (one id per feed comes back instead of [feeds, vocab] fp32
// logits), the speculative MTP step's bookkeeping, and options.profile, which times the phases of every step with
// CUDA events and host clocks (StepProfile). A prompt chunk and a decoded token are the same thing to a step, so
// prefill and decode of different slots share one step.
// With speculation on (make_cuda_engine(..., speculative_mtp)), the checkpoint's MTP module (infer/cuda_mtp.h: a
// one-layer GPU model and its own block program) runs after every step (speculative.h):
// forward_greedy_speculative verifies last step's draft in the same step as the fed token.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "core/error.h"
#include "infer/cuda_mtp.h"
#include "infer/engine.h"
#include "infer/speculative.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mhc_generic.h"
#include "kernels/cuda/speculative_rows.h"
#include "model/cuda/cuda_backend.h"
#include "model/dsv4/program.h"

namespace trex::infer {
namespace {

using dsv4gpu::bf16;
using dsv4gpu::DevMem;
using dsv4gpu::Pool;

constexpr int64_t kDefaultMaxContext = 16384;  // caches are allocated up front for this many tokens per slot

DevMem zeroed(size_t bytes) {
  DevMem m(bytes);
  if (bytes) TREX_CUDA(cudaMemsetAsync(m.as<char>(), 0, bytes, nullptr));
  return m;
}

// A step's tokens as the block program takes them (CachedTokens): ids, positions, sequence of each token, the
// sequences' first tokens and caches.
struct HostStep {
  std::vector<int32_t> ids;
  std::vector<int64_t> pos, seq, seq_begin{0};
  std::vector<dsv4::SequenceCaches*> caches;
  dsv4::CachedTokens tokens() const {
    return dsv4::CachedTokens{pos.data(), seq.data(), seq_begin.data(), int64_t(caches.size()), caches.data()};
  }
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
    // Routed experts as one grouped GEMM (no host read of the expert counts) in every step, except with
    // CudaEngineOptions::per_expert_moe (the reference): the grouped GEMM has no host stall per layer, so no step
    // size is worth the per-expert path.
    dsv4gpu::DecodeOptions dopt;
    dopt.slots = slots_, dopt.max_context = max_context_;
    dopt.reference_attention = o.reference_attention;
    dopt.grouped_experts = !o.per_expert_moe;
    if (o.profile) dopt.mark = [this](int phase) { prof_.mark(phase); };
    m.backend->set_decode(dopt);
    for (int64_t s = 0; s < slots_; ++s) slots_caches_.push_back(m.backend->new_caches());
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
      dsv4gpu::DecodeOptions mopt = dopt;
      mopt.lm_head = m.b16("head.weight"), mopt.lm_vocab = cfg.vocab_size;  // the shared LM head
      dsv4gpu::CudaBackend& mb = *mtp_->block->impl().backend;
      mb.set_decode(mopt);
      for (int64_t s = 0; s < slots_; ++s) mtp_slots_.push_back(mb.new_caches());
      xprev_ = zeroed(size_t(slots_ * 2 * cfg.hc_mult * cfg.hidden) * sizeof(bf16));
      spec_.assign(size_t(slots_), SlotSpec{});
    }
    prof_.on = o.profile;
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
  // Validates every feed (before any state changes) and lays the step out for the block program.
  HostStep plan(const std::vector<EngineFeed>& feeds) const;
  // The step up to the head: device fp32 logits [feeds.size(), V] in step_ (null when there are no feeds), or with
  // head_rows the logits of those rows of the step instead. The final streams stay in step_X_.
  const float* run_step(const std::vector<EngineFeed>& feeds, const std::vector<int32_t>* head_rows = nullptr);
  // A step with the MTP module (speculate_): see speculative.h.
  void speculative_step(const std::vector<EngineFeed>& feeds, Mode mode, std::vector<float>* logits,
                        std::vector<std::vector<int32_t>>* tokens, const std::vector<char>* decoding = nullptr);
  dsv4gpu::CudaBackend& backend() const { return *model_->impl().backend; }

  dsv4::ModelConfig cfg_;
  int64_t slots_ = 0, max_context_ = 0;
  std::unique_ptr<dsv4gpu::GpuModel> model_;
  std::vector<std::unique_ptr<dsv4::SequenceCaches>> slots_caches_;  // slot s: the backend's caches of slot s
  std::vector<int64_t> lengths_;
  Pool step_;                     // the running step's buffers (freed stream-ordered when the next step starts)
  StepProfile prof_;
  const bf16* step_X_ = nullptr;  // the last step's final streams [N, hc, d] (the backend's, until its next pass)
  // Speculation (speculate_): the MTP module and its slots' caches (a window ring each), and per slot the main
  // model's final streams of the two candidate last positions of the last step ([slots, 2, hc, d]: the last fed
  // token's, the draft's).
  bool speculate_ = false;
  std::unique_ptr<GpuMtp> mtp_;
  std::vector<std::unique_ptr<dsv4::SequenceCaches>> mtp_slots_;
  DevMem xprev_;
  // Per slot: the token the engine returned last (-1: none; the MTP's row of position length-1 assumed it), the
  // MTP's draft of the token after it (-1: none), and which xprev_ row holds position length-1.
  struct SlotSpec {
    int32_t guess = -1, draft = -1;
    int xsel = 0;
  };
  std::vector<SlotSpec> spec_;
  SpeculativeStats stats_;
};

// Slot `to` continues where `from` is (n > 1 sequences sharing a prompt): the backend copies from's cache regions
// in every layer, stream-ordered before the next step.
void CudaEngine::copy_slot(int64_t from, int64_t to) {
  TREX_CHECK(from >= 0 && from < slots_ && to >= 0 && to < slots_ && from != to,
             "cuda engine: cannot copy slot {} to slot {} (slots [0, {}))", from, to, slots_);
  const int64_t L = lengths_[size_t(from)];
  backend().decode_caches().copy_slot(from, to, L);
  if (speculate_) {  // the MTP's window ring, the kept final streams and the draft follow the slot
    mtp_->block->impl().backend->decode_caches().copy_slot(from, to, L);
    const size_t X = size_t(2 * cfg_.hc_mult * cfg_.hidden) * sizeof(bf16);
    char* b = xprev_.as<char>();
    TREX_CUDA(cudaMemcpyAsync(b + size_t(to) * X, b + size_t(from) * X, X, cudaMemcpyDeviceToDevice, nullptr));
    spec_[size_t(to)] = spec_[size_t(from)];
  }
  lengths_[size_t(to)] = L;
}

int64_t CudaEngine::cache_bytes() const {
  int64_t b = 0;
  for (int64_t s = 0; s < slots_; ++s) b += backend().decode_caches().bytes(lengths_[size_t(s)]);
  return b;
}

HostStep CudaEngine::plan(const std::vector<EngineFeed>& feeds) const {
  HostStep P;
  std::set<int64_t> seen;
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
      P.pos.push_back(len + j);
      P.seq.push_back(int64_t(it));
    }
    P.seq_begin.push_back(int64_t(P.ids.size()));
    P.caches.push_back(slots_caches_[size_t(f.slot)].get());
  }
  return P;
}

const float* CudaEngine::run_step(const std::vector<EngineFeed>& feeds, const std::vector<int32_t>* head_rows) {
  const HostStep P = plan(feeds);  // validates before any state changes
  if (P.ids.empty()) return nullptr;
  step_.clear();
  dsv4gpu::GpuModel::Impl& m = model_->impl();
  if (prof_.on) {
    bool decode = true;
    for (const EngineFeed& f : feeds) decode = decode && f.n == 1;
    prof_.begin(decode ? fmt::format("decode N={:3d}", feeds.size())
                       : fmt::format("prefill/mixed ~{:5d} tokens", cuda::Gemm::extent_class(int64_t(P.ids.size()))),
                m.gemm.get());
  }
  // Head on each feed's last token, or on head_rows.
  std::vector<int64_t> rows;
  if (head_rows)
    rows.assign(head_rows->begin(), head_rows->end());
  else
    for (size_t it = 0; it < feeds.size(); ++it) rows.push_back(P.seq_begin[it + 1] - 1);
  float* dlog = step_.take<float>(int64_t(rows.size()) * cfg_.vocab_size);
  const dsv4::CachedTokens tokens = P.tokens();
  m.program->decode(P.ids.data(), tokens, int64_t(P.ids.size()), rows.data(), int64_t(rows.size()), dlog);
  for (size_t it = 0; it < feeds.size(); ++it) lengths_[size_t(feeds[it].slot)] += feeds[it].n;
  step_X_ = backend().decode_streams();
  return dlog;
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
  HostStep Q;
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
      Q.pos.push_back(p);
      src.push_back(p == L - 1 ? -(2 * int32_t(f.slot) + sp.xsel) - 1 : int32_t(row + (p - L)));
      next.push_back(p == L - 1 ? f.ids[0] : f.ids[p - L + 1]);
    }
    if (mode != Mode::Logits) {
      cand[size_t(2 * k)] = int32_t(mtp_head.size());
      mtp_head.push_back(int32_t(src.size()));
      Q.pos.push_back(L + n - 1);
      src.push_back(int32_t(row + n - 1));
      next.push_back(-head_of[size_t(k)] - 1);
      if (verify[size_t(k)]) {
        cand[size_t(2 * k + 1)] = int32_t(mtp_head.size());
        mtp_head.push_back(int32_t(src.size()));
        Q.pos.push_back(L + n);
        src.push_back(int32_t(row + n));
        next.push_back(-(head_of[size_t(k)] + 1) - 1);
      }
    }
    const int64_t cnt = int64_t(src.size()) - q0;
    if (cnt > 0) {
      for (int64_t j = 0; j < cnt; ++j) Q.seq.push_back(int64_t(Q.caches.size()));
      Q.caches.push_back(mtp_slots_[size_t(f.slot)].get());
      Q.seq_begin.push_back(int64_t(src.size()));
    }
    row += step_feeds[size_t(k)].n;
  }

  // Main step (validates every feed before any state changes), head on head_rows.
  const float* dlog = run_step(step_feeds, &head_rows);
  const int64_t Hm = int64_t(head_rows.size()), Hq = int64_t(mtp_head.size()), Nq = int64_t(src.size());
  Pool& step = step_;
  int32_t* picks = step.take<int32_t>(Hm + Hq);  // main picks, then the MTP's
  if (mode != Mode::Logits) cuda::decode_argmax_rows(dlog, Hm, V, picks);
  if (Nq > 0) {
    std::vector<int32_t> host(src);
    host.insert(host.end(), next.begin(), next.end());
    int32_t* dev = step.take<int32_t>(int64_t(host.size()));
    TREX_CUDA(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, nullptr));
    bf16* xin = step.take<bf16>(Nq * hc * d);
    mtp_input_streams(*mtp_, model_->impl(), step_X_, xprev_.as<bf16>(), dev, dev + Nq, picks, Nq, step, xin);
    float* mlog = step.take<float>(Hq * V);
    const std::vector<int64_t> rows(mtp_head.begin(), mtp_head.end());
    mtp_->program->decode_from(xin, Q.tokens(), Nq, rows.data(), Hq, mlog);
    if (Hq > 0) cuda::decode_argmax_rows(mlog, Hq, V, picks + Hm);
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
