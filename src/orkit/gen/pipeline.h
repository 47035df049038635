// `trex ordata generate`: draws attempts (family, category, representation, difficulty, target status) from
// per-index seeds, generates, verifies through two routes (and runs each LP-structure answer through the
// evaluator's jail and ORGEval, lp_answer.h), decontaminates and renders them in a pool of
// forked worker processes, keeps the first N that pass in index order (so the output depends only on the
// seed and the options, never on the number of workers), then writes sft.jsonl, cpt.jsonl, stats.json,
// report.html and timing.json (verification seconds per family; the one output that varies between runs).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "orkit/eval/execute.h"
#include "orkit/gen/instance.h"

namespace trex::orkit::gen {

struct GenerateOptions {
  int64_t n = 100;
  uint64_t seed = 0;
  std::filesystem::path out;
  int shard_index = 0, shard_count = 1;
  int workers = 0;  // 0: hardware threads
  std::string profile = "default";  // "default" or "demo" (small, short samples)
  double infeasible_share = 0.06, unbounded_share = 0.04;
  double csv_share = 0.35;  // attached-file samples that get CSV files instead of data.json
  std::vector<std::string> families;  // empty: all
  std::filesystem::path benchmarks;   // empty: <shared>/benchmarks; "none" disables decontamination
  double decontam_threshold = 0.25;
  int decontam_n = 8;
  std::vector<std::filesystem::path> ingest;  // user domain text for the CPT corpus
  double solve_time_limit_s = 20.0;
  bool progress = true;
  // How LP-structure answers run for their check (lp_answer.h): in the evaluator's jail, unless
  // isolation is None (--unsafe-no-sandbox). An empty trex_bin means this executable.
  eval::ExecConfig exec;
};

struct GenerateSummary {
  int64_t kept = 0, attempts = 0, rejected = 0, cpt_docs = 0;
  double seconds = 0;
};

GenerateSummary generate(const GenerateOptions& opts);

// One attempt, fully deterministic in (opts, global index); `slot` is the worker's jail identity.
// Exposed for tests.
json run_attempt(const GenerateOptions& opts, int64_t global_index, const void* decontam_index, int slot = 0);

}  // namespace trex::orkit::gen
