// Scores answers to benchmark items: extract the code, execute it in the sandbox, grade the outcome under
// the benchmark's rule; a worker pool runs items in parallel. Results are per item (results.jsonl) and per
// benchmark / overall (summary.json, a terminal table, report.html).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "orkit/eval/benchmark.h"
#include "orkit/eval/execute.h"
#include "orkit/eval/rules.h"

namespace trex::orkit::eval {

// correct, wrong, infeasible, unbounded, error, timeout, no_code
struct ItemResult {
  std::string id;
  std::string benchmark;
  std::string status;
  std::string detail;  // finer reason: program_error, solver_error, no_model, crashed, wl_graph_mismatch, ...
  std::optional<double> predicted;
  std::optional<double> expected;
  std::string expected_type;  // objective / infeasible / unbounded / lp_structure
  std::string format;         // python / lp / mps / mathprog / none
  std::string solver;         // the solver whose answer decided the verdict (the portfolio's winner); "" if none
  std::string message;        // error text (trimmed)
  double seconds = 0.0;
  nlohmann::json to_json() const;
};

struct BenchmarkScore {
  std::string name;  // file stem
  std::string display_name;
  Rule rule = Rule::Relative;
  int items = 0, skipped_no_ground_truth = 0, scored = 0, correct = 0;
  std::map<std::string, int> status_counts, detail_counts;
  double seconds = 0.0;
  double pass_at_1() const { return scored ? 100.0 * correct / scored : 0.0; }
  std::vector<ItemResult> results;
};

struct ScoreOptions {
  std::optional<Rule> rule;  // override the benchmark's default rule
  ExecConfig exec;
  int jobs = 0;  // 0: hardware concurrency
  bool progress = true;
};

ItemResult score_item(const BenchItem& item, const std::string* response, Rule rule, const ExecConfig& exec,
                      int slot);

// `responses`: id -> the model's whole answer; items without ground truth are skipped and counted.
BenchmarkScore score_benchmark(const Benchmark& bench, const std::map<std::string, std::string>& responses,
                               const ScoreOptions& opts);

// results.jsonl, summary.json and report.html in `dir`; `meta` is merged into summary.json.
void write_results(const std::filesystem::path& dir, const std::vector<BenchmarkScore>& scores,
                   const nlohmann::json& meta);
nlohmann::json summary_json(const std::vector<BenchmarkScore>& scores, const nlohmann::json& meta);
std::string summary_table(const std::vector<BenchmarkScore>& scores);
std::string html_report(const std::vector<BenchmarkScore>& scores, const nlohmann::json& meta);

// Reads {"id": ..., "response": ...} lines; later lines win for the same id.
std::map<std::string, std::string> load_responses(const std::filesystem::path& path);

// One answer of a generate-only run (`trex eval run --generate-only`: a GPU machine without the solvers).
struct ResponseLine {
  std::string id, benchmark, response;
};
// Writes {"id", "benchmark", "response"} lines, the file load_responses / `trex eval score --responses` reads,
// atomically (a temporary name, then renamed).
void write_responses(const std::filesystem::path& path, const std::vector<ResponseLine>& lines);

}  // namespace trex::orkit::eval
