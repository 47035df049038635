// trex eval on real benchmark items: hand-written correct answers (Gurobi-style Python, pulp, pyscipopt,
// coptpy, LP, MPS and MathProg files; ORGEval programs writing LP files) must all score correct, under
// each benchmark's own rule; and the CLI `trex eval score` writes the documented files.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include "core/files.h"
#include "orkit/eval/runner.h"
#include "orkit/eval/sandbox.h"

using namespace trex::orkit::eval;
namespace fs = std::filesystem;

namespace {

fs::path answers_dir() {
  return trex::source_dir() / "tests" / "data" / "eval" / "answers";
}

// Benchmark restricted to the items that have a hand-written answer, and those answers.
Benchmark subset(const std::string& stem, std::map<std::string, std::string>& responses) {
  Benchmark full = load_benchmark(trex::shared_dir() / "benchmarks" / (stem + ".jsonl"));
  Benchmark b = full;
  b.items.clear();
  for (const auto& it : full.items) {
    const fs::path p = answers_dir() / stem / (it.id + ".md");
    if (!fs::exists(p)) continue;
    responses[it.id] = trex::read_text_file(p);
    b.items.push_back(it);
  }
  return b;
}

}  // namespace

TEST(EvalAnswers, HandWrittenCorrectAnswersScoreCorrect) {
  if (!fs::exists(trex::shared_dir() / "benchmarks")) GTEST_SKIP() << "no shared benchmarks";
  ScoreOptions opts;
  opts.exec.trex_bin = TREX_BINARY;
  opts.exec.limits.wall_seconds = 60;
  if (!jail_support().ok) {  // the verdicts do not depend on the jail; the hostile suite tests the jail
    std::fprintf(stderr, "note: no jail here, scoring the oracle answers unisolated: %s\n",
                 jail_support().problem.c_str());
    opts.exec.isolation = Isolation::None;
  }
  opts.jobs = 2;
  opts.progress = false;
  int total = 0;
  std::set<std::string> formats;
  for (const auto& entry : fs::directory_iterator(answers_dir())) {
    const std::string stem = entry.path().filename().string();
    std::map<std::string, std::string> responses;
    Benchmark b = subset(stem, responses);
    ASSERT_EQ(b.items.size(), responses.size());
    ASSERT_FALSE(b.items.empty()) << stem;
    BenchmarkScore s = score_benchmark(b, responses, opts);
    for (const auto& r : s.results) {
      EXPECT_EQ(r.status, "correct") << stem << " " << r.id << " [" << r.format << "] detail=" << r.detail
                                     << " predicted=" << (r.predicted ? std::to_string(*r.predicted) : "none")
                                     << "\n"
                                     << r.message;
      formats.insert(r.format);
    }
    total += int(s.results.size());
  }
  EXPECT_GE(total, 40);
  for (const char* f : {"python", "lp", "mps", "mathprog"}) EXPECT_TRUE(formats.count(f)) << f;
}

TEST(EvalAnswers, CliScoreWritesResultsSummaryAndReport) {
  if (!fs::exists(trex::shared_dir() / "benchmarks")) GTEST_SKIP() << "no shared benchmarks";
  std::string t = (fs::temp_directory_path() / "trex-eval-cli-XXXXXX").string();
  const fs::path dir = mkdtemp(t.data());
  // three answers: one right, one wrong (objective off), one missing code
  std::map<std::string, std::string> responses;
  Benchmark b = subset("nl4opt_289", responses);
  std::string lines;
  lines += nlohmann::json{{"id", "nl4opt289_012"}, {"response", responses.at("nl4opt289_012")}}.dump() + "\n";
  std::string wrong = responses.at("nl4opt289_001");
  wrong.replace(wrong.find("200 * c"), 7, "210 * c");
  lines += nlohmann::json{{"id", "nl4opt289_001"}, {"response", wrong}}.dump() + "\n";
  lines += nlohmann::json{{"id", "nl4opt289_002"}, {"response", "I think it is 150000."}}.dump() + "\n";
  trex::write_text_atomic(dir / "responses.jsonl", lines);
  // a benchmark file of just those three items
  std::ifstream in(trex::shared_dir() / "benchmarks" / "nl4opt_289.jsonl");
  std::string line, bench;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    const std::string id = j["id"];
    if (id == "nl4opt289_012" || id == "nl4opt289_001" || id == "nl4opt289_002") bench += line + "\n";
  }
  trex::write_text_atomic(dir / "nl4opt_289.jsonl", bench);
  const std::string cmd = std::string(TREX_BINARY) + " eval score --benchmark " +
                          (dir / "nl4opt_289.jsonl").string() + " --responses " +
                          (dir / "responses.jsonl").string() + " --out " + (dir / "out").string() +
                          " --timeout 60 --jobs 2 --no-progress > " + (dir / "stdout.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << trex::read_text_file(dir / "stdout.txt");
  std::map<std::string, std::string> status;
  std::ifstream res(dir / "out" / "results.jsonl");
  while (std::getline(res, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"id", "status", "predicted", "expected"}) EXPECT_TRUE(j.contains(k)) << k;
    status[j["id"]] = j["status"];
  }
  EXPECT_EQ(status["nl4opt289_012"], "correct");
  EXPECT_EQ(status["nl4opt289_001"], "wrong");
  EXPECT_EQ(status["nl4opt289_002"], "no_code");
  auto summary = trex::read_json_file(dir / "out" / "summary.json");
  EXPECT_EQ(summary["benchmarks"][0]["rule"], "trex-abs");
  EXPECT_EQ(summary["benchmarks"][0]["correct"], 1);
  EXPECT_EQ(summary["benchmarks"][0]["scored"], 3);
  const std::string out = trex::read_text_file(dir / "stdout.txt");
  EXPECT_NE(out.find("33.33%"), std::string::npos) << out;
  EXPECT_NE(out.find("|p-g| <= 1e-6"), std::string::npos) << out;
  const std::string html = trex::read_text_file(dir / "out" / "report.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  // a rule override is printed next to the score
  const std::string cmd2 = std::string(TREX_BINARY) + " eval score --benchmark " +
                           (dir / "nl4opt_289.jsonl").string() + " --responses " +
                           (dir / "responses.jsonl").string() + " --out " + (dir / "out2").string() +
                           " --rule orlm --no-progress > " + (dir / "stdout2.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd2.c_str()), 0);
  EXPECT_NE(trex::read_text_file(dir / "stdout2.txt").find("ORLM"), std::string::npos);
  fs::remove_all(dir);
}
