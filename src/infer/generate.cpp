#include "infer/generate.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "core/error.h"

namespace trex::infer {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::vector<GenerateResult> generate(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opts,
                                     const std::function<void(size_t, int32_t)>& on_token,
                                     GenerateStats* stats) {
  validate(opts.sampling);
  TREX_CHECK(opts.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}", opts.max_new_tokens);
  const size_t B = prompts.size();
  const int64_t V = decoder.vocab();
  std::vector<int32_t> stop = opts.stop_ids;
  if (stop.empty()) stop.push_back(int32_t(decoder.config().eos_token_id));
  for (size_t i = 0; i < B; ++i) {
    TREX_CHECK(!prompts[i].empty(), "generate: prompt {} is empty", i);
    TREX_CHECK(int64_t(prompts[i].size()) + opts.max_new_tokens <= decoder.max_context(),
               "generate: prompt {} has {} tokens; with max_new_tokens {} it exceeds the context limit of {}",
               i, prompts[i].size(), opts.max_new_tokens, decoder.max_context());
  }
  std::vector<std::unique_ptr<SequenceCache>> seqs;
  std::vector<Sampler> samplers;
  std::vector<GenerateResult> out(B);
  for (size_t i = 0; i < B; ++i) {
    seqs.push_back(decoder.new_sequence());
    SamplingParams sp = opts.sampling;
    sp.seed += i;
    samplers.emplace_back(sp);
    out[i].prompt_tokens = int64_t(prompts[i].size());
  }
  GenerateStats st;
  std::vector<float> logits;
  std::vector<int32_t> next(B, -1);
  std::vector<bool> done(B, opts.max_new_tokens == 0);
  auto pick = [&](size_t i, float* row) {
    if (int64_t(out[i].tokens.size()) < opts.min_new_tokens)
      for (int32_t s : stop)
        if (s >= 0 && s < V) row[s] = -std::numeric_limits<float>::infinity();
    const int32_t t = samplers[i].sample(row, V);
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

  // Prefill (all prompts together, optionally in chunks); the last chunk's logits give the first token.
  auto t0 = std::chrono::steady_clock::now();
  const int64_t chunk = opts.prefill_chunk > 0 ? opts.prefill_chunk : std::numeric_limits<int64_t>::max();
  std::vector<int64_t> fed(B, 0);
  for (;;) {
    std::vector<StepItem> items;
    std::vector<size_t> who;
    for (size_t i = 0; i < B; ++i) {
      const int64_t left = int64_t(prompts[i].size()) - fed[i];
      if (left <= 0) continue;
      const int64_t n = std::min(left, chunk);
      items.push_back(StepItem{seqs[i].get(), prompts[i].data() + fed[i], n, false});
      who.push_back(i);
      fed[i] += n;
    }
    if (items.empty()) break;
    decoder.step(items, logits);
    for (size_t k = 0; k < who.size(); ++k) {
      st.prefill_tokens += items[k].n;
      if (fed[who[k]] == int64_t(prompts[who[k]].size()) && !done[who[k]])
        pick(who[k], logits.data() + k * V);
    }
  }
  st.prefill_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<StepItem> items;
    std::vector<size_t> who;
    for (size_t i = 0; i < B; ++i)
      if (!done[i]) {
        items.push_back(StepItem{seqs[i].get(), &next[i], 1, false});
        who.push_back(i);
      }
    if (items.empty()) break;
    decoder.step(items, logits);
    ++st.decode_steps;
    st.decode_tokens += int64_t(items.size());
    for (size_t k = 0; k < who.size(); ++k) pick(who[k], logits.data() + k * V);
  }
  st.decode_seconds = seconds_since(t0);
  if (stats) *stats = st;
  return out;
}

}  // namespace trex::infer
