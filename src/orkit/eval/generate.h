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
  int samples = 1;                  // n answers per item (Pass@k needs n >= k)
  Protocol protocol = Protocol::Trex;
  std::string data_base_dir;        // Bench4Opt "File Path Base Directory"; empty: the benchmark's directory
};

struct GenerationStats {
  long prompt_tokens = 0, completion_tokens = 0;
  int requests = 0, cached = 0, failed = 0;
};

// id -> up to opts.samples answers (sample order) for every item with ground truth that got any. The
// samples of an item are asked for in one request with the API's `n`; when the server returns fewer
// choices, each missing sample s is requested alone with seed + s. Every sample is cached on its own
// (sample 0 under the same key as a one-sample run), so a resumed run asks only for what is missing.
std::map<std::string, std::vector<std::string>> generate_samples(const Benchmark& bench, const OpenAIClient& client,
                                                                 ResponseCache& cache, const GenerateOptions& opts,
                                                                 bool progress, GenerationStats& stats);

// id -> response for every item with ground truth that got one (the first sample).
std::map<std::string, std::string> generate_responses(const Benchmark& bench, const OpenAIClient& client,
                                                      ResponseCache& cache, const GenerateOptions& opts,
                                                      bool progress, GenerationStats& stats);

}  // namespace trex::orkit::eval
