#include "infer/generate.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"
#include "infer/speculative.h"

namespace trex::infer {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The Decoder as an Engine: one caller-owned decoder, one sequence per slot (so both entry points share one loop).
class DecoderEngine final : public Engine {
 public:
  DecoderEngine(Decoder& d, int64_t slots) : d_(d) {
    for (int64_t i = 0; i < slots; ++i) seqs_.push_back(d_.new_sequence());
  }
  std::string name() const override { return "cpu"; }
  const dsv4::ModelConfig& config() const override { return d_.config(); }
  int64_t slots() const override { return int64_t(seqs_.size()); }
  int64_t max_context() const override { return d_.max_context(); }
  int64_t slot_length(int64_t slot) const override { return seqs_.at(size_t(slot))->length(); }
  void reset(int64_t slot) override { seqs_.at(size_t(slot)) = d_.new_sequence(); }
  void forward(const std::vector<EngineFeed>& feeds, std::vector<float>& logits) override {
    std::vector<StepItem> items;
    for (const EngineFeed& f : feeds) items.push_back(StepItem{seqs_.at(size_t(f.slot)).get(), f.ids, f.n, false});
    d_.step(items, logits);
  }
  int64_t cache_bytes() const override {
    int64_t b = 0;
    for (const auto& q : seqs_) b += int64_t(q->bytes());
    return b;
  }

 private:
  Decoder& d_;
  std::vector<std::unique_ptr<SequenceCache>> seqs_;
};

}  // namespace

std::vector<GenerateResult> generate(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opts,
                                     const std::function<void(size_t, int32_t)>& on_token,
                                     GenerateStats* stats) {
  DecoderEngine e(decoder, std::max<int64_t>(int64_t(prompts.size()), 1));
  return generate(e, prompts, opts, on_token, stats);
}

std::vector<GenerateResult> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opts,
                                     const std::function<void(size_t, int32_t)>& on_token,
                                     GenerateStats* stats) {
  validate(opts.sampling);
  TREX_CHECK(opts.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}", opts.max_new_tokens);
  const size_t B = prompts.size();
  TREX_CHECK(int64_t(B) <= engine.slots(), "generate: {} prompts but the {} engine has {} slots", B, engine.name(),
             engine.slots());
  const int64_t V = engine.config().vocab_size;
  std::vector<int32_t> stop = opts.stop_ids;
  if (stop.empty()) stop.push_back(int32_t(engine.config().eos_token_id));
  for (size_t i = 0; i < B; ++i) {
    TREX_CHECK(!prompts[i].empty(), "generate: prompt {} is empty", i);
    TREX_CHECK(int64_t(prompts[i].size()) + opts.max_new_tokens <= engine.max_context(),
               "generate: prompt {} has {} tokens; with max_new_tokens {} it exceeds the context limit of {}",
               i, prompts[i].size(), opts.max_new_tokens, engine.max_context());
  }
  std::vector<Sampler> samplers;
  std::vector<GenerateResult> out(B);
  for (size_t i = 0; i < B; ++i) {
    engine.reset(int64_t(i));
    SamplingParams sp = opts.sampling;
    sp.seed += i;
    samplers.emplace_back(sp);
    out[i].prompt_tokens = int64_t(prompts[i].size());
  }
  GenerateStats st;
  std::vector<float> logits;
  std::vector<int32_t> next(B, -1);
  std::vector<bool> done(B, opts.max_new_tokens == 0);
  auto take = [&](size_t i, int32_t t) {
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) {
      out[i].finish_reason = "stop";
      done[i] = true;
      return;
    }
    out[i].tokens.push_back(t);
    next[i] = t;
    if (on_token) on_token(i, t);
    if (int64_t(out[i].tokens.size()) >= opts.max_new_tokens) {
      out[i].finish_reason = "length";
      done[i] = true;
    }
  };
  auto pick = [&](size_t i, float* row) {
    if (int64_t(out[i].tokens.size()) < opts.min_new_tokens)
      for (int32_t s : stop)
        if (s >= 0 && s < V) row[s] = -std::numeric_limits<float>::infinity();
    take(i, samplers[i].sample(row, V));
  };
  // Speculative decoding (the engine's MTP drafts, speculative.h) for greedy requests without a minimum length
  // (stop tokens are suppressed on logits the speculative step does not return); every other case runs plain.
  SpeculativeEngine* spec = speculative_engine(engine);
  if (spec && !(spec->speculating() && opts.sampling.temperature == 0.0 && opts.min_new_tokens == 0))
    spec = nullptr;
  std::vector<std::vector<int32_t>> picked;

  // Prefill (all prompts together, optionally in chunks); the last chunk's logits give the first token.
  auto t0 = std::chrono::steady_clock::now();
  const int64_t chunk = opts.prefill_chunk > 0 ? opts.prefill_chunk : std::numeric_limits<int64_t>::max();
  std::vector<int64_t> fed(B, 0);
  for (;;) {
    std::vector<EngineFeed> items;
    std::vector<size_t> who;
    for (size_t i = 0; i < B; ++i) {
      const int64_t left = int64_t(prompts[i].size()) - fed[i];
      if (left <= 0) continue;
      const int64_t n = std::min(left, chunk);
      items.push_back(EngineFeed{int64_t(i), prompts[i].data() + fed[i], n});
      who.push_back(i);
      fed[i] += n;
    }
    if (items.empty()) break;
    if (spec)
      spec->forward_greedy_speculative(items, std::vector<char>(items.size(), 0), picked);
    else
      engine.forward(items, logits);
    for (size_t k = 0; k < who.size(); ++k) {
      st.prefill_tokens += items[k].n;
      if (fed[who[k]] == int64_t(prompts[who[k]].size()) && !done[who[k]]) {
        if (spec)
          take(who[k], picked[k].front());  // a prompt feed verifies no draft: one token
        else
          pick(who[k], logits.data() + k * V);
      }
    }
  }
  st.prefill_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<EngineFeed> items;
    std::vector<size_t> who;
    for (size_t i = 0; i < B; ++i)
      if (!done[i]) {
        items.push_back(EngineFeed{int64_t(i), &next[i], 1});
        who.push_back(i);
      }
    if (items.empty()) break;
    ++st.decode_steps;
    if (spec) {
      spec->forward_greedy_speculative(items, std::vector<char>(items.size(), 1), picked);
      for (size_t k = 0; k < who.size(); ++k)
        for (int32_t t : picked[k]) {
          if (done[who[k]]) break;  // a stop or the length limit before an accepted draft's successor
          take(who[k], t);
          ++st.decode_tokens;
        }
      continue;
    }
    engine.forward(items, logits);
    st.decode_tokens += int64_t(items.size());
    for (size_t k = 0; k < who.size(); ++k) pick(who[k], logits.data() + k * V);
  }
  st.decode_seconds = seconds_since(t0);
  if (stats) *stats = st;
  return out;
}

}  // namespace trex::infer
