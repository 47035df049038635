// Self-distillation by rejection sampling (`trex ordata distill`): every verified SFT sample's prompt (the
// evaluation prompt, i.e. the sample's system + user messages) goes to an OpenAI-compatible teacher; each
// answer's program runs in the evaluator's sandbox against python/trex_solvers (LP-file answers are read
// and solved in-process); an answer is kept only when its result reproduces the sample's verified status
// and objective (relative 1e-6). Kept answers are cleaned: text outside the tags is dropped and the tags
// are rewritten in the canonical <think>/<model>/<python> (or <think>/<model> + ```lp) layout.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "orkit/gen/instance.h"

namespace trex::orkit::gen {

struct DistillOptions {
  std::filesystem::path in;   // sft.jsonl from `trex ordata generate`
  std::filesystem::path out;  // sft.jsonl (kept), rejections.jsonl, distill_stats.json
  std::string base_url, model;
  int samples = 1;    // teacher answers drawn per item; the first that passes is kept
  int64_t limit = 0;  // items to use (0: all)
  int workers = 2;    // concurrent items
  double temperature = 0.7, top_p = 0.95;
  int max_tokens = 4096;
  int seed = 1;
  double request_timeout_s = 600, exec_timeout_s = 60;
  int max_attempts = 4;  // HTTP attempts per request (client retries)
  double backoff_s = 1.0;
  double rel_tol = 1e-6;
  std::filesystem::path trex_bin;    // for `trex solve` inside trex_solvers; empty: this executable
  std::filesystem::path python_pkg;  // empty: the evaluator's default (python/trex_solvers)
  std::string python;                // empty: /usr/bin/python3 or python3 on PATH
  bool progress = true;
};

struct DistillSummary {
  int64_t items = 0, answers = 0, kept = 0;
  std::map<std::string, int64_t> rejected;  // reason -> answers
  double seconds = 0;
};

DistillSummary distill(const DistillOptions& opts);

// The canonical form of a teacher answer: {think, model, python | lp}; nullopt when it has no code.
struct CleanAnswer {
  std::string think, model, code;
  bool lp = false;  // code is an LP file
  std::string text() const;
};
std::optional<CleanAnswer> clean_answer(const std::string& response);

// Runs a Python answer in a fresh sandboxed directory holding `files` (name -> text) and returns
// {"status": optimal|infeasible|unbounded|infeasible_or_unbounded|error, "objective", "message"}.
json run_python_answer(const std::string& code, const json& files, const DistillOptions& opts, int slot);

}  // namespace trex::orkit::gen
