// trex eval: scoring rules, answer extraction, benchmark loading and ORGEval's structural equivalence.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "orkit/eval/benchmark.h"
#include "orkit/eval/extract.h"
#include "orkit/eval/orgeval.h"
#include "orkit/eval/prompts.h"
#include "orkit/eval/rules.h"
#include "orkit/eval/runner.h"
#include "orkit/lp/lp_format.h"

using namespace trex::orkit;
using namespace trex::orkit::eval;

TEST(EvalRules, TrexAbsoluteIsAbsolute) {
  EXPECT_TRUE(objective_matches(Rule::TrexAbsolute, 3000.0000005, 3000.0));
  EXPECT_FALSE(objective_matches(Rule::TrexAbsolute, 3000.00001, 3000.0));
  EXPECT_FALSE(objective_matches(Rule::TrexAbsolute, 1e9 + 1e-3, 1e9));  // no relative slack
}

TEST(EvalRules, RelativeUsesGtPlusOne) {
  EXPECT_TRUE(objective_matches(Rule::Relative, 1e9 + 1e-3, 1e9));
  EXPECT_FALSE(objective_matches(Rule::Relative, 1e9 + 1e4, 1e9));
  EXPECT_TRUE(objective_matches(Rule::Relative, 5e-7, 0.0));
  EXPECT_FALSE(objective_matches(Rule::Relative, 2e-6, 0.0));
}

TEST(EvalRules, OrlmRoundsThenFivePercent) {
  EXPECT_TRUE(objective_matches(Rule::OrlmRounded, 104.4, 100.0));
  EXPECT_FALSE(objective_matches(Rule::OrlmRounded, 105.6, 100.0));
  EXPECT_TRUE(objective_matches(Rule::OrlmRounded, 0.3, 0.0));  // rounds to 0
  EXPECT_FALSE(objective_matches(Rule::OrlmRounded, 0.6, 0.0));
}

TEST(EvalRules, ReSocraticNeedsEveryLabelledValue) {
  nlohmann::json labels = {{"black", "136.0"}, {"green", "45.0"}, {"profit", "655.0"}};
  EXPECT_TRUE(resocratic_matches(labels, 655.0, {{"b", 136.00001}, {"g", 45.0}}));
  EXPECT_FALSE(resocratic_matches(labels, 655.0, {{"b", 135.0}, {"g", 46.0}}));
  EXPECT_FALSE(resocratic_matches(labels, 655.001, {{"b", 136.0}, {"g", 45.0}}));
}

TEST(EvalRules, NamesRoundTripAndDefaults) {
  for (Rule r : {Rule::TrexAbsolute, Rule::Relative, Rule::OrlmRounded, Rule::ReSocratic, Rule::Absolute01,
                 Rule::Absolute001, Rule::LpStructure})
    EXPECT_EQ(parse_rule(rule_name(r)), r);
  EXPECT_THROW(parse_rule("nonsense"), trex::Error);
  EXPECT_EQ(default_rule("optibench", false), Rule::TrexAbsolute);
  EXPECT_EQ(default_rule("nl4opt_289", false), Rule::TrexAbsolute);
  EXPECT_EQ(default_rule("industryor", false), Rule::Relative);
  EXPECT_EQ(default_rule("bench4opt_orgeval", true), Rule::LpStructure);
}

TEST(EvalExtract, LongestPythonBlockWins) {
  const std::string r =
      "<think>\n```python\nprint(1)\n```\n</think>\n<python>\n```python\nimport gurobipy as gp\n"
      "m = gp.Model()\nm.optimize()\n```\n</python>";
  auto c = extract_code(r);
  EXPECT_EQ(c.format, CodeFormat::Python);
  EXPECT_NE(c.code.find("gp.Model()"), std::string::npos);
}

TEST(EvalExtract, RecognisesFencesAndContent) {
  EXPECT_EQ(extract_code("```lp\nMaximize\n x\nSubject To\n c: x <= 1\nEnd\n```").format, CodeFormat::Lp);
  EXPECT_EQ(extract_code("```\nMinimize\n obj: x + y\nSubject To\n c1: x + y >= 2\nEnd\n```").format,
            CodeFormat::Lp);
  EXPECT_EQ(extract_code("```\nNAME X\nROWS\n N obj\nCOLUMNS\n x obj 1\nRHS\nENDATA\n```").format,
            CodeFormat::Mps);
  EXPECT_EQ(extract_code("```gmpl\nvar x >= 0;\nmaximize z: x;\ns.t. c: x <= 1;\nend;\n```").format,
            CodeFormat::MathProg);
  EXPECT_EQ(extract_code("```\nvar x >= 0;\nmaximize z: x;\ns.t. c: x <= 1;\nsolve;\nend;\n```").format,
            CodeFormat::MathProg);
  EXPECT_EQ(extract_code("```\nimport pulp\nprob = pulp.LpProblem('a')\n```").format, CodeFormat::Python);
  EXPECT_EQ(extract_code("<python>\nimport gurobipy as gp\nmodel = gp.Model()\n</python>").format,
            CodeFormat::Python);
  EXPECT_EQ(extract_code("The answer is 42.").format, CodeFormat::None);
  EXPECT_EQ(extract_code("```json\n{\"a\": 1}\n```").format, CodeFormat::None);
}

TEST(EvalBenchmark, LoadsSharedFilesAndCountsMissingGroundTruth) {
  const auto dir = trex::shared_dir() / "benchmarks";
  if (!std::filesystem::exists(dir / "nlp4lp.jsonl")) GTEST_SKIP() << "no shared benchmarks at " << dir;
  Benchmark b = load_benchmark(dir / "nlp4lp.jsonl");
  EXPECT_EQ(b.items.size(), 264u);
  EXPECT_EQ(b.skipped_no_ground_truth(), 14);  // README: 14 "optimal" items without ground truth
  int infeasible = 0;
  for (const auto& it : b.items) infeasible += it.answer_type == AnswerType::Infeasible;
  EXPECT_EQ(infeasible, 8);
  Benchmark org = load_benchmark(dir / "bench4opt_orgeval.jsonl");
  EXPECT_EQ(org.items.size(), 394u);
  EXPECT_EQ(org.skipped_no_ground_truth(), 0);
  EXPECT_EQ(org.items[0].grade, GradeKind::LpStructure);
  EXPECT_TRUE(org.items[0].data.is_object());
  Benchmark ob = load_benchmark(dir / "optibench.jsonl");
  EXPECT_TRUE(ob.items[5].expected_values.is_object());
  // prompts: ORGEval is a single user message, B4O-Feasible names data.json
  auto p = build_prompt(prompt_format_for("auto", org.items[0]), org.items[0]);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].role, "user");
  EXPECT_NE(p[0].content.find(".lp"), std::string::npos);
  Benchmark feas = load_benchmark(dir / "bench4opt_feasible.jsonl");
  auto pf = build_prompt(prompt_format_for("auto", feas.items[0]), feas.items[0]);
  ASSERT_EQ(pf.size(), 2u);
  EXPECT_NE(pf[1].content.find("data.json"), std::string::npos);
  auto pt = build_prompt(prompt_format_for("auto", ob.items[0]), ob.items[0]);
  EXPECT_NE(pt[0].content.find("<python>"), std::string::npos);
}

TEST(EvalBenchmark, BadLineNamesFileAndLine) {
  const auto path = std::filesystem::temp_directory_path() / "trex_eval_bad.jsonl";
  trex::write_text_atomic(path, "{\"id\": \"a\", \"question\": \"q\", \"answer\": 1}\n{not json}\n");
  try {
    load_benchmark(path);
    FAIL() << "expected an error";
  } catch (const trex::Error& e) {
    EXPECT_NE(std::string(e.what()).find("trex_eval_bad.jsonl:2"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

namespace {
EquivalenceVerdict eq(const std::string& a, const std::string& b) {
  return check_lp_equivalence(read_lp(a, "ref"), read_lp(b, "cand"));
}
}  // namespace

TEST(EvalOrgEval, RenamedAndReorderedModelIsEquivalent) {
  const std::string ref =
      "Maximize\n obj: x + 2 y + 3 z\nSubject To\n c1: x + y + z <= 4\n c2: x - y >= -2\n"
      " c3: 2 y + z <= 5\nBounds\n z <= 10\nEnd\n";
  const std::string cand =
      "Maximize\n 3 c + b + 2 a\nSubject To\n q: 2 a + c <= 5\n p: b - a >= -2\n"
      " r: c + a + b <= 4\nBounds\n c <= 10\nEnd\n";
  auto v = eq(ref, cand);
  EXPECT_TRUE(v.equivalent) << v.reason;
  EXPECT_EQ(v.reason, "equivalent");
}

TEST(EvalOrgEval, DifferentCoefficientCountOrBoundIsNot) {
  const std::string ref = "Maximize\n obj: x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x - y >= -2\nEnd\n";
  EXPECT_EQ(
      eq(ref, "Maximize\n obj: x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x - 1.5 y >= -2\nEnd\n").reason,
      "wl_graph_mismatch");
  EXPECT_EQ(eq(ref,
               "Maximize\n obj: x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x - y >= -2\n c3: x + 2 y <= 9\n"
               "End\n")
                .reason,
            "constraint_count_mismatch");
  EXPECT_EQ(
      eq(ref, "Maximize\n obj: x + 2 y + w\nSubject To\n c1: x + y <= 4\n c2: x - y >= -2\nEnd\n").reason,
      "var_count_mismatch");
  EXPECT_EQ(eq(ref,
               "Maximize\n obj: x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x - y >= -2\nBounds\n y <= 3\n"
               "End\n")
                .reason,
            "wl_graph_mismatch");
  // a differently oriented row with non-zero right-hand side is a different row (as in the reference)
  EXPECT_FALSE(
      eq(ref, "Maximize\n obj: x + 2 y\nSubject To\n c1: - x - y >= -4\n c2: x - y >= -2\nEnd\n").equivalent);
  // but a zero right-hand side `<=` row is oriented to `>=`
  const std::string z = "Minimize\n obj: x + y\nSubject To\n c1: x - 2 y <= 0\n c2: x + y >= 1\nEnd\n";
  EXPECT_TRUE(
      eq(z, "Minimize\n obj: x + y\nSubject To\n c1: 2 y - x >= 0\n c2: x + y >= 1\nEnd\n").equivalent);
}

TEST(EvalOrgEval, SingleVariableRowsBecomeBoundsWithTheReferenceQuirk) {
  const std::string with_row = "Minimize\n obj: x + y\nSubject To\n c1: x + y >= 1\n b1: x <= 3\nEnd\n";
  const std::string with_bound = "Minimize\n obj: x + y\nSubject To\n c1: x + y >= 1\nBounds\n x <= 3\nEnd\n";
  EXPECT_TRUE(eq(with_row, with_bound).equivalent);
  // -2 x <= 4 becomes UB = -2 (sense not flipped), replacing the declared bound
  const std::string neg = "Minimize\n obj: x + y\nSubject To\n c1: x + y >= 1\n b1: -2 x <= 4\nEnd\n";
  EXPECT_TRUE(
      eq(neg, "Minimize\n obj: x + y\nSubject To\n c1: x + y >= 1\nBounds\n x <= -2\nEnd\n").equivalent);
  EXPECT_FALSE(
      eq(neg, "Minimize\n obj: x + y\nSubject To\n c1: x + y >= 1\nBounds\n x >= -2\nEnd\n").equivalent);
}

TEST(EvalOrgEval, SymmetricModelIsNotCertifiable) {
  // x, y, z and the three rows are interchangeable: one connected component holds a whole colour class.
  const std::string sym =
      "Minimize\n obj: x + y + z\nSubject To\n a: x + y >= 1\n b: y + z >= 1\n"
      " c: x + z >= 1\nEnd\n";
  auto v = eq(sym, sym);
  EXPECT_FALSE(v.equivalent);
  EXPECT_EQ(v.reason, "reference_not_certifiable");
  // identical variables that are not linked through a shared symmetric class are fine
  const std::string ok = "Minimize\n obj: x + y\nSubject To\n a: x + y >= 1\nEnd\n";
  EXPECT_TRUE(eq(ok, ok).equivalent);
}

// A generate-only run's file (`trex eval run --generate-only`) is what `trex eval score --responses` reads back:
// ids, multi-line answers with quotes and non-ASCII text survive; nothing but the file is left in the directory.
TEST(EvalResponses, WrittenResponsesLoadBackForScoring) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("trex_eval_responses_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<trex::orkit::eval::ResponseLine> lines = {
      {"nl4opt_1", "nl4opt", "<python>\n```python\nmodel = 1  # \"quoted\"\n```\n</python>"},
      {"optibench_7", "optibench", "Kosten minimieren: 3 \u00d7 x \u2264 5"},
      {"optibench_8", "optibench", ""}};
  trex::orkit::eval::write_responses(dir / "responses.jsonl", lines);
  const auto back = trex::orkit::eval::load_responses(dir / "responses.jsonl");
  ASSERT_EQ(back.size(), lines.size());
  for (const auto& l : lines) EXPECT_EQ(back.at(l.id), l.response) << l.id;
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file(), (void)e;
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
  fs::remove_all(dir);
}
