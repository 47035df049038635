// The founding report's four-set table as one run: NL4OPT-289, OptiBench-600, B4O-Feasible and
// B4O-ORGEval, n samples per item from an OpenAI-compatible server, each sample scored (under either
// protocol), Pass@k for every requested k with the unbiased estimator, and the plain mean of the four
// sets as the report averages them. Writes suite.json, suite.html and samples.jsonl (one line per item and
// sample: status, solver, detail).
#pragma once
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orkit/eval/generate.h"
#include "orkit/eval/runner.h"

namespace trex::orkit::eval {

// Unbiased Pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (computed as a product,
// exact for any n). Requires 0 <= c <= n and 1 <= k <= n.
double pass_at_k(int n, int c, int k);

struct SuiteSet {
  std::string label;  // the report's column name
  std::string stem;   // benchmark file stem in the benchmarks directory
};
// NL4OPT-289 (nl4opt_289), OptiBench-600 (optibench), B4O-Feasible (bench4opt_feasible),
// B4O-ORGEval (bench4opt_orgeval).
const std::vector<SuiteSet>& report_sets();

struct SuiteOptions {
  GenerateOptions generate;  // samples, protocol, sampling, prompt format, concurrency, limit
  ScoreOptions score;
  std::filesystem::path benchmarks_dir;
  std::vector<int> ks{1};
  std::filesystem::path out;
  bool progress = true;
};

struct SuiteSetResult {
  SuiteSet set;
  int items = 0;    // items with ground truth that were asked for
  int samples = 0;  // n
  std::map<int, double> pass_at;  // k -> percent
  std::map<std::string, int> correct_of;  // id -> c
  std::string rule;
  GenerationStats generation;
};

// Runs the four sets (generation through `client`, cached in `cache`), writes the files into opts.out
// and returns suite.json's content.
nlohmann::json run_suite(const OpenAIClient& client, ResponseCache& cache, const SuiteOptions& opts,
                         const nlohmann::json& meta);

std::string suite_html(const nlohmann::json& suite);

}  // namespace trex::orkit::eval
