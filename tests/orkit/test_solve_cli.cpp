// `trex solve`: the JSON contract the evaluator's gurobipy look-alike relies on, text output, formats,
// errors; and the Gurobi-written ORGEval reference LPs of the shared benchmark (parse all, solve a
// sample, compare with the recorded solver objectives).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;
namespace fs = std::filesystem;

namespace {

struct CliRun {
  int code;
  std::string out;
};

CliRun run_cli(const std::string& args, const std::string& stdin_text = "") {
  std::string cmd = std::string(TREX_BINARY) + " " + args + " 2>/dev/null";
  fs::path in;
  if (!stdin_text.empty()) {
    in = fs::temp_directory_path() / ("trex-cli-stdin-" + std::to_string(::getpid()) + ".lp");
    std::ofstream(in) << stdin_text;
    cmd += " < " + in.string();
  }
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  const int status = pclose(p);
  if (!in.empty()) fs::remove(in);
  return {WEXITSTATUS(status), out};
}

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("trex-cli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

const char* kLp = "Maximize\n obj: 3 x[0] + 2 y + 5\nSubject To\n c1: x[0] + y <= 4\n c2: x[0] + 3 y <= 6\n"
                  "Bounds\n x[0] <= 3\nEnd\n";

}  // namespace

TEST(SolveCli, JsonSchema) {
  const fs::path f = write_temp("a.lp", kLp);
  const CliRun r = run_cli("solve " + f.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["status"], "optimal");
  EXPECT_NEAR(j["objective"].get<double>(), 16.0, 1e-9);  // 9 + 2 + 5
  EXPECT_NEAR(j["values"]["x[0]"].get<double>(), 3.0, 1e-9);
  EXPECT_NEAR(j["values"]["y"].get<double>(), 1.0, 1e-9);
  EXPECT_EQ(j["solver"], "clp");
  EXPECT_TRUE(j["seconds"].is_number());
  EXPECT_TRUE(j["message"].is_string());
  EXPECT_EQ(j["problem_class"], "LP");
  EXPECT_EQ(j["num_vars"], 2);
  EXPECT_EQ(j["num_rows"], 2);
  for (const char* solver : {"cbc", "glpk", "ipopt"}) {
    if (!solver_available(parse_solver(solver))) continue;
    const auto k = nlohmann::json::parse(run_cli("solve " + f.string() + " --json --solver " + solver).out);
    EXPECT_EQ(k["solver"], solver);
    EXPECT_NEAR(k["objective"].get<double>(), 16.0, 1e-6) << solver;
  }
  fs::remove_all(f.parent_path());
}

TEST(SolveCli, StatusesStdinAndErrors) {
  const auto inf = nlohmann::json::parse(
      run_cli("solve - --json", "Minimize\n x\nSubject To\n a: x >= 2\n b: x <= 1\nEnd\n").out);
  EXPECT_EQ(inf["status"], "infeasible");
  EXPECT_TRUE(inf["objective"].is_null());
  EXPECT_TRUE(inf["values"].empty());
  const auto unb = nlohmann::json::parse(run_cli("solve - --json", "Maximize\n x\nSubject To\n a: x >= 2\nEnd\n").out);
  EXPECT_EQ(unb["status"], "unbounded");
  // A syntax error: exit 1, status "error", the message names the line.
  const CliRun bad = run_cli("solve - --json", "Minimize\n x\nSubject To\n c1: x + + <= 3\nEnd\n");
  EXPECT_EQ(bad.code, 1);
  const auto e = nlohmann::json::parse(bad.out);
  EXPECT_EQ(e["status"], "error");
  EXPECT_NE(e["message"].get<std::string>().find("<stdin>:4:"), std::string::npos) << e["message"];
  const CliRun missing = run_cli("solve /nonexistent/file.lp --json");
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(nlohmann::json::parse(missing.out)["status"], "error");
}

TEST(SolveCli, TextOutputMpsAndConversion) {
  const fs::path f = write_temp("b.lp", kLp);
  const fs::path mps = f.parent_path() / "b.mps", lp2 = f.parent_path() / "b2.lp";
  const CliRun r = run_cli("solve " + f.string() + " --write-mps " + mps.string() + " --write-lp " + lp2.string());
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("status: optimal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("objective: 16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x[0] = 3"), std::string::npos) << r.out;
  const auto from_mps = nlohmann::json::parse(run_cli("solve " + mps.string() + " --json").out);
  EXPECT_NEAR(from_mps["objective"].get<double>(), 16.0, 1e-9);
  const auto from_lp = nlohmann::json::parse(run_cli("solve " + lp2.string() + " --json").out);
  EXPECT_NEAR(from_lp["objective"].get<double>(), 16.0, 1e-9);
  if (solver_available(SolverKind::Glpk)) {
    const fs::path mod = write_temp("c.mod", "var x >= 0;\nvar y >= 0;\nmaximize z: 3*x + 2*y;\n"
                                             "s.t. c1: x + y <= 4;\ns.t. c2: x + 3*y <= 6;\ns.t. c3: x <= 3;\nend;\n");
    const auto mp = nlohmann::json::parse(run_cli("solve " + mod.string() + " --json").out);
    EXPECT_EQ(mp["status"], "optimal");
    EXPECT_NEAR(mp["objective"].get<double>(), 11.0, 1e-9);
  }
  fs::remove_all(f.parent_path());
}

// The ORGEval reference LPs (written by Gurobi 12): every one must parse; a fixed sample of those with a
// recorded solver objective is solved and compared (|ours - gurobi| <= 1e-6 (|gurobi| + 1)).
TEST(SolveCli, OrgevalReferenceLpsParseAndSolve) {
  const fs::path bench = trex::shared_dir() / "benchmarks" / "bench4opt_orgeval.jsonl";
  if (!fs::exists(bench)) GTEST_SKIP() << bench << " not present";
  std::ifstream in(bench);
  std::string line;
  int items = 0, parsed = 0, checked = 0, matched = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    ++items;
    Model m;
    try {
      m = read_lp(j["extra"]["reference_lp"].get<std::string>(), j["id"].get<std::string>());
      ++parsed;
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    // Every 4th item with an answer, linear only (keeps the test to a few seconds on a loaded machine).
    if (j["answer"].is_null() || m.is_quadratic() || items % 4 != 0) continue;
    SolveOptions o;
    o.time_limit_s = 20;
    // CBC 2.10 spins on sched_yield during its search, so on a loaded 2-core CI machine a MILP that
    // takes it 0.1 s of CPU can exceed any wall limit; GLPK gives the MILP reference here.
    if (m.has_integers() && solver_available(SolverKind::Glpk)) o.solver = SolverKind::Glpk;
    const SolveResult r = solve(m, o);
    ++checked;
    const double a = j["answer"].get<double>();
    if (r.status == SolveStatus::Optimal && std::abs(r.objective - a) <= 1e-6 * (std::abs(a) + 1)) ++matched;
    else ADD_FAILURE() << j["id"] << ": " << status_name(r.status) << " " << r.objective << " vs " << a << " " << r.message;
  }
  EXPECT_EQ(items, 394);
  EXPECT_EQ(parsed, items);
  EXPECT_GE(checked, 30);
  EXPECT_EQ(matched, checked);
  std::printf("ORGEval reference LPs: %d/%d parse; %d/%d sampled solves match the recorded objective\n", parsed,
              items, matched, checked);
}
