// B4O-Feasible item 132 (a 3-variable integer knapsack; CBC alone needs about a minute) scores correct
// through `trex eval` in under 2 s thanks to the integer portfolio, and results.jsonl names the solver
// that decided it.
#include <gtest/gtest.h>

#include <chrono>

#include "core/files.h"
#include "orkit/eval/runner.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;
namespace fs = std::filesystem;

namespace {

// Wall seconds to score `id` of B4O-Feasible with its held-out answer, and the result.
std::pair<double, eval::ItemResult> score_one(const eval::Benchmark& full, const std::string& id) {
  eval::Benchmark b = full;
  std::erase_if(b.items, [&](const eval::BenchItem& it) { return it.id != id; });
  EXPECT_EQ(b.items.size(), 1u) << id;
  const std::map<std::string, std::string> responses{
      {id, trex::read_text_file(trex::source_dir() / "tests" / "data" / "eval" / "answers" / "bench4opt_feasible" /
                                (id + ".md"))}};
  eval::ScoreOptions opts;
  opts.exec.trex_bin = TREX_BINARY;
  opts.exec.limits.wall_seconds = 15;  // CBC alone (about a minute) times out: the item would not be correct
  opts.jobs = 1;
  opts.progress = false;
  const auto t0 = std::chrono::steady_clock::now();
  const eval::BenchmarkScore s = eval::score_benchmark(b, responses, opts);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {secs, s.results.at(0)};
}

}  // namespace

// Bounds: the 15 s wall limit per program (CBC alone needs about a minute, so without the portfolio the item
// times out and is not correct), and 2 s over the cost of scoring a trivial item on this machine (the LP item
// 2, scored just before: the Python start and two jails), doubled so that a loaded machine (both solvers
// then share the cores with everything else) does not fail it; idle, the item takes well under 2 s.
TEST(EvalPortfolio, Bench4OptFeasible132ScoresCorrectInUnderTwoSeconds) {
  if (!solver_available(SolverKind::Cbc) || !solver_available(SolverKind::Glpk)) GTEST_SKIP() << "needs CBC and GLPK";
  const fs::path bench = trex::shared_dir() / "benchmarks" / "bench4opt_feasible.jsonl";
  if (!fs::exists(bench)) GTEST_SKIP() << "no shared benchmarks";
  const eval::Benchmark full = eval::load_benchmark(bench);
  const auto [control_secs, control] = score_one(full, "b4o_feasible_BENCH4OPT_2");
  EXPECT_EQ(control.status, "correct") << control.message;
  const auto [secs, r] = score_one(full, "b4o_feasible_BENCH4OPT_132");
  std::printf("B4O-Feasible 132: %.2f s (control item 2: %.2f s), solver %s\n", secs, control_secs, r.solver.c_str());
  EXPECT_EQ(r.status, "correct") << r.detail << "\n" << r.message;
  EXPECT_LT(secs, 2.0 + 2.0 * control_secs);
  EXPECT_TRUE(r.solver == "glpk" || r.solver == "cbc") << r.solver;
  EXPECT_EQ(r.to_json().value("solver", ""), r.solver);
}
