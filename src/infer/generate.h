// Batched generation on the CPU decoder or any Engine: one prefill step for all prompts, then one decode step per new
// token over every unfinished sequence. Stops a sequence at a stop token (EOS by default; the stop token is
// not returned) or after max_new_tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infer/decoder.h"
#include "infer/engine.h"
#include "infer/sampler.h"

namespace trex::infer {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  int64_t min_new_tokens = 0;     // stop tokens are suppressed (logit -inf) until this many were produced
  SamplingParams sampling;        // sequence i samples with seed + i
  std::vector<int32_t> stop_ids;  // empty: the config's eos_token_id
  int64_t prefill_chunk = 0;      // > 0: feed prompts in chunks of this many tokens (bounds peak memory)
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "stop" or "length"
  int64_t prompt_tokens = 0;
};

struct GenerateStats {
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_steps = 0;
};

// on_token(sequence index, token) is called for every returned token as soon as it is sampled.
std::vector<GenerateResult> generate(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opts,
                                     const std::function<void(size_t, int32_t)>& on_token = {},
                                     GenerateStats* stats = nullptr);
// The same on any engine (slots 0 .. prompts-1 are reset and used; the engine needs that many slots).
std::vector<GenerateResult> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                     const GenerateOptions& opts,
                                     const std::function<void(size_t, int32_t)>& on_token = {},
                                     GenerateStats* stats = nullptr);

}  // namespace trex::infer
