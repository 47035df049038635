// `--protocol report` (the founding report's prompts, extraction and ORGEval rewrites) beside T-Rex's own
// protocol; Pass@k's unbiased estimator against hand-computed values; and `trex eval suite` (the four-set
// table, n samples through the API's `n` with the repeated-request fall-back) against a loopback stub of
// an OpenAI-compatible server.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "core/files.h"
#include "orkit/eval/extract.h"
#include "orkit/eval/prompts.h"
#include "orkit/eval/protocol.h"
#include "orkit/eval/runner.h"
#include "orkit/eval/suite.h"

using namespace trex::orkit::eval;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path answers_dir() { return trex::source_dir() / "tests" / "data" / "eval" / "answers"; }
std::string answer(const std::string& stem, const std::string& id) {
  return trex::read_text_file(answers_dir() / stem / (id + ".md"));
}

Benchmark only(const std::string& stem, const std::vector<std::string>& ids) {
  Benchmark b = load_benchmark(trex::shared_dir() / "benchmarks" / (stem + ".jsonl"));
  std::erase_if(b.items, [&](const BenchItem& it) { return std::find(ids.begin(), ids.end(), it.id) == ids.end(); });
  return b;
}

ScoreOptions score_opts() {
  ScoreOptions o;
  o.exec.trex_bin = TREX_BINARY;
  o.exec.limits.wall_seconds = 60;
  o.jobs = 2;
  o.progress = false;
  return o;
}

bool have_benchmarks() { return fs::exists(trex::shared_dir() / "benchmarks" / "nl4opt_289.jsonl"); }

}  // namespace

TEST(PassAtK, UnbiasedEstimatorMatchesHandComputedValues) {
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 1), 0.25);               // c / n
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 2), 0.5);                // 1 - C(3,2)/C(4,2) = 1 - 3/6
  EXPECT_NEAR(pass_at_k(5, 2, 3), 0.9, 1e-15);              // 1 - C(3,3)/C(5,3) = 1 - 1/10
  EXPECT_NEAR(pass_at_k(10, 3, 4), 1.0 - 35.0 / 210.0, 1e-15);  // C(7,4) = 35, C(10,4) = 210
  EXPECT_NEAR(pass_at_k(16, 5, 4), 1.0 - 330.0 / 1820.0, 1e-15);  // C(11,4) = 330, C(16,4) = 1820
  EXPECT_DOUBLE_EQ(pass_at_k(8, 0, 4), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(8, 8, 4), 1.0);
  EXPECT_DOUBLE_EQ(pass_at_k(8, 5, 4), 1.0);  // n - c < k: every k-subset holds a correct one
  EXPECT_DOUBLE_EQ(pass_at_k(1, 1, 1), 1.0);
  EXPECT_THROW(pass_at_k(3, 1, 4), trex::Error);  // k > n
  EXPECT_THROW(pass_at_k(3, 4, 1), trex::Error);  // c > n
}

TEST(ReportProtocol, ExtractionFollowsTheReportsTwoFunctions) {
  const std::string tagged = "<think>plan</think>\n<python>\nimport gurobipy as gp\nmodel = gp.Model()\n</python>\n";
  EXPECT_EQ(extract_code_report_solver(tagged).how, "report: <python> tags");
  // ORGEval ignores <python> tags: the text after </think> is passed through whole
  const ExtractedCode org = extract_code_report_orgeval(tagged);
  EXPECT_EQ(org.how, "report: text after </think>");
  EXPECT_NE(org.code.find("<python>"), std::string::npos);
  // a python fence inside the think section beats a plain one after it (solver targets)
  const std::string think_fence = "<think>\n```python\nx = 1\n```\n</think>\n```\n" + std::string(60, '#') + "\n```\n";
  EXPECT_EQ(extract_code_report_solver(think_fence).code, "x = 1\n");
  // a plain block of <= 50 characters loses to a longer one, but is taken when alone
  EXPECT_EQ(extract_code_report_solver("```\nshort\n```\n").code, "short\n");
  // an LP file in an ```lp fence is a plain block: run as Python by the report's harness
  // (without a think section the whole response is the "after think" text)
  EXPECT_EQ(extract_code_report_orgeval("```lp\nMinimize\n x\nEnd\n```\n").how, "report: plain block after think");
  EXPECT_EQ(extract_code_report_orgeval("```lp\nMinimize\n x\nEnd\n```\n</think>\nsee above").how,
            "report: plain block");
  EXPECT_EQ(extract_code_report_solver("just prose").how, "report: whole response");
}

TEST(ReportProtocol, OrgEvalRewritesReproduceTheHarness) {
  const std::string lp = "temp_lp/a.lp", data = "lp_data/d.json";
  // the write call is redirected; data.json becomes the relative data path
  EXPECT_EQ(report_orgeval_rewrites("d = json.load(open('./data.json'))\nmodel.write('x.lp')\n", lp, data),
            "d = json.load(open('./lp_data/d.json'))\nmodel.write('temp_lp/a.lp')\n");
  // a nested ')' in the argument: the rewrite stops at the first ')' and leaves a syntax error
  EXPECT_EQ(report_orgeval_rewrites("model.write(os.path.join(out, 'x.lp'))\n", lp, data),
            "model.write('temp_lp/a.lp'))\n");
  // no write: one is appended, on `m` when the code builds with m.addVar(s)
  EXPECT_EQ(report_orgeval_rewrites("m = gp.Model()\nx = m.addVar()\n", lp, data),
            "m = gp.Model()\nx = m.addVar()\nm.write('temp_lp/a.lp')\n");
  // the lb quirk: one-line addVars without lb= become free; range(n) (a nested ')') or lb= prevent it
  EXPECT_EQ(report_orgeval_rewrites("x = model.addVars(5, name='x')\nmodel.write('q')\n", lp, data),
            "x = model.addVars(5, name='x', lb=-GRB.INFINITY)\nmodel.write('temp_lp/a.lp')\n");
  const std::string kept = "x = model.addVars(range(5), name='x')\ny = model.addVars(3, lb=0)\nmodel.write('q')\n";
  EXPECT_EQ(report_orgeval_rewrites(kept, lp, data),
            "x = model.addVars(range(5), name='x')\ny = model.addVars(3, lb=0)\nmodel.write('temp_lp/a.lp')\n");
}

TEST(ReportProtocol, PromptsCarryTheReportsBlocks) {
  BenchItem b4o;
  b4o.id = "b";
  b4o.question = "Q?";
  b4o.data_path = "lp_final/data_2_problem2.json";
  b4o.data = json::object();
  for (Protocol p : {Protocol::Report, Protocol::Trex}) {
    const auto m = build_prompt(PromptFormat::B4oFeasible, b4o, p, "/data/bench4opt");
    ASSERT_EQ(m.size(), 2u);
    EXPECT_NE(m[1].content.find("### File Path Base Directory\n/data/bench4opt\n"), std::string::npos)
        << protocol_name(p);
    EXPECT_NE(m[1].content.find("`lp_final/data_2_problem2.json`"), std::string::npos);
    EXPECT_NE(m[1].content.find("variable named `model`"), std::string::npos);
  }
  BenchItem org;
  org.question = "PROBLEM TEXT";
  org.grade = GradeKind::LpStructure;
  const auto r = build_prompt(PromptFormat::OrgEval, org, Protocol::Report);
  ASSERT_EQ(r.size(), 1u);  // one user message, no system message
  EXPECT_EQ(r[0].role, "user");
  EXPECT_TRUE(r[0].content.ends_with("\n\nPROBLEM TEXT"));
  EXPECT_NE(r[0].content.find("Gurobi 12.x"), std::string::npos);
  BenchItem nl;
  nl.question = "How many?";
  const auto rn = build_prompt(PromptFormat::Trex, nl, Protocol::Report);
  const auto tn = build_prompt(PromptFormat::Trex, nl, Protocol::Trex);
  EXPECT_EQ(rn[1].content, "Answer the following mathematical modeling question:\nHow many?\nPlease think step by step.");
  EXPECT_EQ(rn[1].content, tn[1].content);
  EXPECT_EQ(rn[0].content.find("```python"), std::string::npos);  // T-Rex's additions are not in the report's
  EXPECT_NE(tn[0].content.find("```python"), std::string::npos);
}

TEST(ReportProtocol, OrgEvalNeedsCodeThatWritesTheLpFile) {
  if (!have_benchmarks()) GTEST_SKIP() << "no shared benchmarks";
  // b4o_orgeval 24's held-out answer is a fenced LP file, 0's a program writing one
  const Benchmark b = only("bench4opt_orgeval", {"b4o_orgeval_BENCH4OPT_24", "b4o_orgeval_BENCH4OPT_0"});
  ASSERT_EQ(b.items.size(), 2u);
  const std::map<std::string, std::string> responses{
      {"b4o_orgeval_BENCH4OPT_24", answer("bench4opt_orgeval", "b4o_orgeval_BENCH4OPT_24")},
      {"b4o_orgeval_BENCH4OPT_0", answer("bench4opt_orgeval", "b4o_orgeval_BENCH4OPT_0")}};
  std::map<std::string, std::string> status[2];
  int p = 0;
  for (Protocol protocol : {Protocol::Trex, Protocol::Report}) {
    const BenchmarkScore s = score_benchmark(b, apply_protocol(protocol, b, responses), score_opts());
    for (const auto& r : s.results) status[p][r.id] = r.status + " " + r.detail + " " + r.message.substr(0, 300);
    ++p;
  }
  EXPECT_TRUE(status[0]["b4o_orgeval_BENCH4OPT_24"].starts_with("correct")) << status[0]["b4o_orgeval_BENCH4OPT_24"];
  EXPECT_TRUE(status[0]["b4o_orgeval_BENCH4OPT_0"].starts_with("correct")) << status[0]["b4o_orgeval_BENCH4OPT_0"];
  EXPECT_FALSE(status[1]["b4o_orgeval_BENCH4OPT_24"].starts_with("correct")) << status[1]["b4o_orgeval_BENCH4OPT_24"];
  EXPECT_TRUE(status[1]["b4o_orgeval_BENCH4OPT_0"].starts_with("correct")) << status[1]["b4o_orgeval_BENCH4OPT_0"];
}

TEST(ReportProtocol, SolverTargetsReadTheObjectiveOfModelOrM) {
  if (!have_benchmarks()) GTEST_SKIP() << "no shared benchmarks";
  const Benchmark b = only("nl4opt_289", {"nl4opt289_000"});
  const std::string good = answer("nl4opt_289", "nl4opt289_000");
  std::string renamed = good;  // the same program with its model under another name
  for (size_t at; (at = renamed.find("model")) != std::string::npos;) renamed.replace(at, 5, "mdl");
  // SystemExit after building the model: the look-alikes still find it, the report's runner fails
  const std::string exits = "```python\n" + extract_code(good).code + "import sys\nsys.exit(0)\n```\n";
  std::map<std::string, std::string> st[2];
  int p = 0;
  for (Protocol protocol : {Protocol::Trex, Protocol::Report}) {
    for (const auto& [name, text] : std::map<std::string, std::string>{{"good", good}, {"renamed", renamed}, {"exits", exits}}) {
      const BenchmarkScore s = score_benchmark(b, apply_protocol(protocol, b, {{"nl4opt289_000", text}}), score_opts());
      st[p][name] = s.results.at(0).status + " " + s.results.at(0).detail;
    }
    ++p;
  }
  EXPECT_TRUE(st[0]["good"].starts_with("correct")) << st[0]["good"];
  EXPECT_TRUE(st[1]["good"].starts_with("correct")) << st[1]["good"];
  EXPECT_FALSE(st[1]["renamed"].starts_with("correct")) << "report: only `model` / `m` count: " << st[1]["renamed"];
  EXPECT_FALSE(st[1]["exits"].starts_with("correct")) << st[1]["exits"];
}
