// trex ordata: the LP-structure answers are gurobipy programs that write the model as an LP file (the
// report's ORGEval contract); the generator runs each one in the evaluator's jail and keeps it only when
// ORGEval finds its LP file equivalent to the verified reference LP.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "orkit/eval/execute.h"
#include "orkit/eval/sandbox.h"
#include "orkit/gen/lp_answer.h"
#include "orkit/gen/pipeline.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/render.h"
#include "orkit/gen/verify.h"
#include "orkit/lp/lp_format.h"

using namespace trex::orkit;
using namespace trex::orkit::gen;
namespace fs = std::filesystem;

namespace {

#define REQUIRE_JAIL_AND_PYTHON()                                                                   \
  if (!eval::jail_support().ok) GTEST_SKIP() << "no jail here: " << eval::jail_support().problem; \
  if (!fs::exists(eval::default_python_pkg() / "gurobipy.py"))                                     \
  GTEST_SKIP() << "no solver look-alikes at " << eval::default_python_pkg()

eval::ExecConfig exec_config() {
  eval::ExecConfig c;
  c.trex_bin = TREX_BINARY;
  c.limits.wall_seconds = 30;
  return c;
}

Instance make(const std::string& family, uint64_t seed) {
  Rng rng(seed);
  GenRequest req;
  req.difficulty = Difficulty::Small;
  return find_family(family).generate(rng, req);
}

std::string python_block(const Rendered& r) {
  const std::string a = r.messages.back()["content"].get<std::string>();
  const size_t open = a.find("<python>\n"), close = a.rfind("</python>");
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return a.substr(open + 9, close - open - 9);
}

std::map<std::string, std::string> files_of(const Rendered& r) {
  std::map<std::string, std::string> f;
  for (auto it = r.files.begin(); it != r.files.end(); ++it) f[it.key()] = it->get<std::string>();
  return f;
}

}  // namespace

TEST(OrdataLpAnswer, ProgramsWriteAnLpFileThatPassesOrgevalThroughTheJail) {
  REQUIRE_JAIL_AND_PYTHON();
  struct Case {
    std::string family;
    uint64_t seed;
    Representation rep;
    AttachFormat attach;
  };
  const std::vector<Case> cases = {
      {"production_planning", 11, Representation::Inline, AttachFormat::Json},
      {"transportation", 3, Representation::Table, AttachFormat::Json},
      {"knapsack", 5, Representation::Attached, AttachFormat::Json},
      {"staff_assignment", 6, Representation::Attached, AttachFormat::Csv},
      {"diet", 7, Representation::Inline, AttachFormat::Json},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.family);
    const Instance in = make(c.family, c.seed);
    const Verdict v = verify_instance(in);
    ASSERT_TRUE(v.ok) << v.reason << " " << v.detail;
    Rng rng(c.seed);
    const Rendered rd = render(in, Category::LpStructure, c.rep, rng, c.attach);
    const std::string code = python_block(rd);
    ASSERT_FALSE(code.empty());
    EXPECT_NE(code.find("import gurobipy as gp"), std::string::npos);
    EXPECT_NE(code.find("model.write(\"" + c.family + ".lp\")"), std::string::npos);
    EXPECT_EQ(code.find("optimize"), std::string::npos);  // structure only: the model is not solved
    EXPECT_NE(rd.messages[1]["content"].get<std::string>().find(c.family + ".lp"), std::string::npos);
    const LpAnswerCheck chk = check_lp_answer(code, files_of(rd), v.lp, exec_config(), 0);
    EXPECT_TRUE(chk.ok) << chk.reason << ": " << chk.detail;
    // The file ORGEval compared is the program's own LP file, not the reference text.
    EXPECT_NE(chk.lp_text, v.lp);
    EXPECT_NO_THROW(read_lp(chk.lp_text, "answer"));
  }
}

TEST(OrdataLpAnswer, ChangedCoefficientFailsOrgeval) {
  REQUIRE_JAIL_AND_PYTHON();
  const Instance in = make("production_planning", 11);
  const Verdict v = verify_instance(in);
  ASSERT_TRUE(v.ok);
  // The same program with one resource-usage coefficient changed: a different constraint matrix.
  Instance wrong = in;
  bool changed = false;
  for (auto& [r, row] : wrong.data["usage"].items())
    for (auto& [p, a] : row.items())
      if (!changed && a.get<double>() > 0) {
        a = a.get<double>() + 1.5;
        changed = true;
      }
  ASSERT_TRUE(changed);
  const LpAnswerCheck bad =
      check_lp_answer(lp_writer_program(wrong, Representation::Inline), {}, v.lp, exec_config(), 0);
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.reason, "lp_answer_wl_graph_mismatch") << bad.detail;
  // Control: the unchanged program passes.
  const LpAnswerCheck good =
      check_lp_answer(lp_writer_program(in, Representation::Inline), {}, v.lp, exec_config(), 0);
  EXPECT_TRUE(good.ok) << good.reason << ": " << good.detail;
  // A program that raises writes nothing and is reported as such.
  const LpAnswerCheck crash = check_lp_answer("raise RuntimeError('no model')\n", {}, v.lp, exec_config(), 0);
  EXPECT_FALSE(crash.ok);
  EXPECT_EQ(crash.reason, "lp_answer_program");
}

TEST(OrdataLpAnswer, GeneratorKeepsCheckedAnswersDeterministicallyAndDropsFailures) {
  REQUIRE_JAIL_AND_PYTHON();
  GenerateOptions o;
  o.profile = "demo";
  o.seed = 3;
  o.families = {"knapsack", "production_planning"};
  o.exec = exec_config();
  // The first attempts whose drawn category is lp_structure.
  std::vector<int64_t> lp_indices;
  json first;
  for (int64_t gi = 0; gi < 40 && lp_indices.size() < 2; ++gi) {
    const json r = run_attempt(o, gi, nullptr);
    if (r.value("category", "") != "lp_structure") continue;
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump().substr(0, 600);
    EXPECT_EQ(r["sample"]["verification"]["lp_answer"], "orgeval_equivalent");
    if (lp_indices.empty()) first = r["sample"];
    lp_indices.push_back(gi);
  }
  ASSERT_EQ(lp_indices.size(), 2u);
  // Same seed and index: the same bytes.
  EXPECT_EQ(run_attempt(o, lp_indices[0], nullptr)["sample"].dump(), first.dump());
  // Another run seed draws other instances.
  GenerateOptions o2 = o;
  o2.seed = 4;
  bool differs = false;
  for (int64_t gi = 0; gi < 40 && !differs; ++gi) {
    const json r = run_attempt(o2, gi, nullptr);
    if (r.value("category", "") == "lp_structure" && r["ok"].get<bool>())
      differs = r["sample"]["messages"].dump() != first["messages"].dump();
  }
  EXPECT_TRUE(differs);
  // Where the answer cannot run (no gurobipy to import), the attempt is dropped with the reason.
  const fs::path empty = fs::temp_directory_path() / ("trex_no_pkg_" + std::to_string(::getpid()));
  fs::create_directories(empty);
  for (const char* f : {"_trex_run.py", "_trex_core.py"}) fs::copy_file(eval::default_python_pkg() / f, empty / f);
  GenerateOptions o3 = o;
  o3.exec.python_pkg = empty;
  const json dropped = run_attempt(o3, lp_indices[0], nullptr);
  fs::remove_all(empty);
  EXPECT_FALSE(dropped["ok"].get<bool>());
  EXPECT_EQ(dropped["reason"], "lp_answer_program") << dropped.dump().substr(0, 600);
}
