// Getting answers from a served model: prompts per item, the OpenAI-compatible client, the response cache,
// `concurrency` requests in flight, a progress bar. Failed requests are recorded (and not cached) so the
// item scores as no_code and a later run retries it.
#pragma once
#include <map>
#include <string>

#include "orkit/eval/benchmark.h"
#include "orkit/eval/cache.h"
#include "orkit/eval/openai_client.h"
#include "orkit/eval/prompts.h"

namespace trex::orkit::eval {

struct GenerateOptions {
  ClientOptions client;
  SamplingParams sampling;
  std::string prompt_format = "auto";
  int concurrency = 16;
  int limit = 0;
};

struct GenerationStats {
  long prompt_tokens = 0, completion_tokens = 0;
  int requests = 0, cached = 0, failed = 0;
};

// id -> response for every item with ground truth that got one.
std::map<std::string, std::string> generate_responses(const Benchmark& bench, const OpenAIClient& client,
                                                      ResponseCache& cache, const GenerateOptions& opts,
                                                      bool progress, GenerationStats& stats);

}  // namespace trex::orkit::eval
