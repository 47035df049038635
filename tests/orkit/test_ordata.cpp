// Tests of the OR data generator (src/orkit/gen): every family on fixed seeds through both verification
// routes, rejection of a planted wrong model, the three representations, decontamination of a planted
// benchmark question, MinHash near-duplicate removal, and the CLI end to end (determinism, files).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/files.h"
#include "orkit/eval/sandbox.h"
#include "orkit/gen/attach_csv.h"
#include "orkit/gen/corpus.h"
#include "orkit/gen/decontam.h"
#include "orkit/gen/mathprog_data.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/render.h"
#include "orkit/gen/text.h"
#include "orkit/gen/verify.h"
#include "orkit/lp/lp_format.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;
using namespace trex::orkit::gen;

namespace {

Instance make(const Family& f, uint64_t seed, Difficulty d, Expected target = Expected::Optimal) {
  Rng rng(seed);
  GenRequest req;
  req.difficulty = d;
  req.target = target;
  return f.generate(rng, req);
}

}  // namespace

TEST(OrdataFamilies, CoverTheIssueList) {
  ASSERT_GE(families().size(), 24u);
  for (const char* name : {"production_planning", "blending", "diet", "transportation", "transshipment", "assignment",
                           "knapsack", "bin_packing", "cutting_stock", "set_covering", "uncapacitated_facility_location",
                           "capacitated_facility_location", "lot_sizing", "workforce_shift", "machine_scheduling",
                           "min_cost_flow", "max_flow", "shortest_path", "multi_commodity_flow", "tsp", "vrp",
                           "portfolio", "capacity_planning", "media_allocation", "crop_planning", "staff_assignment"})
    EXPECT_NO_THROW(find_family(name)) << name;
  std::set<std::string> classes;
  for (const auto& f : families()) {
    Rng rng(3);
    classes.insert(f.generate(rng, GenRequest{}).problem_class);
  }
  EXPECT_EQ(classes, (std::set<std::string>{"LP", "MILP", "QP"}));
}

// Regressions for the rejections of the first 10k run: lot sizing with an early demand peak (no initial
// stock, cumulative capacity below cumulative demand) and production planning with a product that uses
// no resource and has no market limit (unbounded when optimal was intended).
TEST(OrdataFamilies, FeasibleTargetsAreFeasibleByConstruction) {
  for (const char* name : {"lot_sizing", "production_planning"})
    for (uint64_t seed = 1; seed <= 25; ++seed) {
      const Instance in = make(find_family(name), seed, seed % 2 ? Difficulty::Medium : Difficulty::Large);
      ASSERT_EQ(in.expected, Expected::Optimal);
      if (std::string(name) == "lot_sizing") {
        double cap = 0, dem = 0;
        for (const auto& p : in.data["periods"]) {
          cap += in.data["capacity"][p.get<std::string>()].get<double>();
          dem += in.data["demand"][p.get<std::string>()].get<double>();
          EXPECT_GE(cap, dem) << "seed " << seed;
        }
      }
      const Verdict v = verify_instance(in);
      EXPECT_TRUE(v.ok) << name << " seed " << seed << ": " << v.reason << " " << v.detail;
    }
}

TEST(OrdataFamilies, EveryFamilyVerifiesOnFixedSeeds) {
  ASSERT_GE(families().size(), 24u);
  for (const auto& f : families()) {
    for (uint64_t seed : {1u, 2u}) {
      for (Difficulty d : {Difficulty::Small, Difficulty::Medium}) {
        const Instance in = make(f, seed, d);
        EXPECT_EQ(in.family, f.name);
        ASSERT_FALSE(in.model.vars.empty()) << f.name;
        const Verdict v = verify_instance(in);
        EXPECT_TRUE(v.ok) << f.name << " seed " << seed << ": " << v.reason << " " << v.detail;
        if (v.ok && in.expected == Expected::Optimal) {
          // The kept LP text re-solves to the recorded objective.
          EXPECT_EQ(recheck_lp(v.lp, "optimal", v.objective), "") << f.name;
        }
      }
    }
  }
}

TEST(OrdataFamilies, SameSeedSameInstance) {
  for (const auto& f : families()) {
    const Instance a = make(f, 42, Difficulty::Medium), b = make(f, 42, Difficulty::Medium);
    EXPECT_EQ(a.data.dump(), b.data.dump()) << f.name;
    EXPECT_EQ(write_lp(a.model), write_lp(b.model)) << f.name;
  }
}

TEST(OrdataFamilies, InfeasibleAndUnboundedTargetsAreReached) {
  int checked = 0;
  for (const auto& f : families()) {
    if (f.can_infeasible) {
      const Instance in = make(f, 7, Difficulty::Small, Expected::Infeasible);
      const Verdict v = verify_instance(in);
      EXPECT_EQ(in.expected, Expected::Infeasible) << f.name;
      EXPECT_TRUE(v.ok) << f.name << ": " << v.reason << " " << v.detail;
      EXPECT_FALSE(in.status_reason.empty());
      ++checked;
    }
    if (f.can_unbounded) {
      for (uint64_t seed = 1; seed < 20; ++seed) {  // some families make unbounded only in the LP variant
        const Instance in = make(f, seed, Difficulty::Small, Expected::Unbounded);
        if (in.expected != Expected::Unbounded) continue;
        const Verdict v = verify_instance(in);
        EXPECT_TRUE(v.ok) << f.name << ": " << v.reason << " " << v.detail;
        ++checked;
        break;
      }
    }
  }
  EXPECT_GE(checked, 3);
}

TEST(OrdataVerify, PlantedWrongCoefficientIsRejected) {
  const Instance good = make(find_family("transportation"), 3, Difficulty::Small);
  Instance bad = good;
  for (auto& t : bad.model.objective) t.coef *= 1.001;  // the route-1 builder now disagrees with MathProg
  const Verdict vg = verify_instance(good), vb = verify_instance(bad);
  ASSERT_TRUE(vg.ok) << vg.detail;
  EXPECT_FALSE(vb.ok);
  EXPECT_EQ(vb.reason, "objective_mismatch") << vb.detail;
}

TEST(OrdataVerify, PlantedWrongRecordedObjectiveIsRejected) {
  const Instance in = make(find_family("knapsack"), 5, Difficulty::Small);
  const Verdict v = verify_instance(in);
  ASSERT_TRUE(v.ok) << v.detail;
  EXPECT_EQ(recheck_lp(v.lp, "optimal", v.objective), "");
  EXPECT_NE(recheck_lp(v.lp, "optimal", v.objective + 1.0), "");
  EXPECT_NE(recheck_lp(v.lp, "infeasible", 0.0), "");
}

TEST(OrdataVerify, WrongExpectedStatusIsRejected) {
  Instance in = make(find_family("production_planning"), 9, Difficulty::Small);
  in.expected = Expected::Infeasible;  // the data are feasible: both routes must disagree with the claim
  const Verdict v = verify_instance(in);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, "route1_status");
}

TEST(OrdataRender, ThreeRepresentations) {
  const Instance in = make(find_family("production_planning"), 11, Difficulty::Small);
  const Verdict v = verify_instance(in);
  ASSERT_TRUE(v.ok);
  Rng rng(1);
  const std::string prof = in.data["profit"].begin().value().dump();
  const auto inl = render(in, Category::SolverCode, Representation::Inline, rng);
  const auto tab = render(in, Category::SolverCode, Representation::Table, rng);
  const auto att = render(in, Category::Formulation, Representation::Attached, rng);
  const auto ext = render(in, Category::ExternalData, Representation::Attached, rng);
  const auto lp = render(in, Category::LpStructure, Representation::Table, rng);
  auto user = [](const Rendered& r) {
    for (const auto& m : r.messages)
      if (m["role"] == "user") return m["content"].get<std::string>();
    return std::string();
  };
  auto assistant = [](const Rendered& r) { return r.messages.back()["content"].get<std::string>(); };
  EXPECT_EQ(user(inl).find("| "), std::string::npos);  // prose, no table
  EXPECT_NE(user(tab).find("|---|"), std::string::npos);
  EXPECT_NE(user(att).find("### data.json"), std::string::npos);
  EXPECT_TRUE(att.files.contains("data.json"));
  EXPECT_EQ(user(ext).find("```json"), std::string::npos);  // external data: keys only, numbers in the file
  EXPECT_NE(user(ext).find("`capacity`"), std::string::npos);
  EXPECT_TRUE(ext.files.contains("data.json"));
  EXPECT_EQ(json::parse(ext.files["data.json"].get<std::string>()), in.data);
  for (const auto* r : {&inl, &tab, &att, &ext}) {
    const std::string a = assistant(*r);
    EXPECT_NE(a.find("<think>"), std::string::npos);
    EXPECT_NE(a.find("</model>\n<python>"), std::string::npos);
    EXPECT_NE(a.find("model.optimize()"), std::string::npos);
  }
  EXPECT_NE(assistant(att).find("json.load"), std::string::npos);
  EXPECT_NE(assistant(inl).find("data = {"), std::string::npos);
  // The LP-structure answer is the gurobipy program that writes the model as an LP file, not the file itself.
  EXPECT_EQ(assistant(lp).find("```lp"), std::string::npos);
  EXPECT_NE(assistant(lp).find("<python>\n" + lp_writer_program(in, Representation::Table)), std::string::npos);
  EXPECT_NE(assistant(lp).find("model.write(\"production_planning.lp\")"), std::string::npos);
  EXPECT_EQ(assistant(lp).find("model.optimize()"), std::string::npos);
  // Every profit value appears in the prose of the inline representation.
  for (auto& [p, val] : in.data["profit"].items()) EXPECT_NE(user(inl).find(money(val.get<double>())), std::string::npos);
}

TEST(OrdataRender, CsvAttachment) {
  const Instance in = make(find_family("staff_assignment"), 4, Difficulty::Small);
  const Verdict v = verify_instance(in);
  ASSERT_TRUE(v.ok) << v.detail;
  Rng rng(1);
  const auto ext = render(in, Category::ExternalData, Representation::Attached, rng, AttachFormat::Csv);
  const auto att = render(in, Category::SolverCode, Representation::Attached, rng, AttachFormat::Csv);
  EXPECT_FALSE(ext.files.contains("data.json"));
  const auto files = csv_files(in);
  ASSERT_EQ(ext.files.size(), files.size());
  size_t rows = 0;
  for (const auto& f : files) {
    ASSERT_TRUE(ext.files.contains(f.name)) << f.name;
    rows += std::count(f.text.begin(), f.text.end(), '\n') - 1;
  }
  // Long format: one row per set member, per indexed-set member and per parameter entry.
  size_t expected = 0;
  for (auto it = in.data.begin(); it != in.data.end(); ++it) {
    if (it->is_array()) expected += it->size();
    if (it->is_object())
      for (auto& [k, sub] : it->items()) expected += sub.is_array() || sub.is_object() ? sub.size() : 1;
  }
  EXPECT_EQ(rows, expected);
  const std::string user = ext.messages[1]["content"];
  EXPECT_NE(user.find("`cost.csv`"), std::string::npos) << user;
  EXPECT_EQ(user.find("data.json"), std::string::npos);
  const std::string code = ext.messages.back()["content"];
  EXPECT_NE(code.find("read_rows(\"available.csv\")"), std::string::npos);
  EXPECT_EQ(code.find("json.load"), std::string::npos);
  EXPECT_NE(att.messages[1]["content"].get<std::string>().find("### cost.csv\n```csv\nkey1,key2,value\n"),
            std::string::npos);
  // The CSV text carries the numbers exactly as the JSON does.
  const std::string first = in.data["cost"].begin().key();
  const auto& inner = in.data["cost"][first];
  EXPECT_NE(ext.files["cost.csv"].get<std::string>().find(first + "," + inner.begin().key() + "," +
                                                          inner.begin().value().dump()),
            std::string::npos);
}

TEST(OrdataMathProg, DataSectionFromJson) {
  json d;
  d["I"] = {"a", "b"};
  d["arcs"] = json::array({json::array({"a", "b"})});
  d["w"]["a"] = 1.5;
  d["c"]["a"]["b"] = 2;
  d["cov"]["a"] = {"b"};
  d["Q"] = 10;
  const std::string s = write_mathprog_data(d);
  EXPECT_NE(s.find("set I := 'a' 'b';"), std::string::npos) << s;
  EXPECT_NE(s.find("set arcs := ('a','b');"), std::string::npos) << s;
  EXPECT_NE(s.find("'a' 1.5"), std::string::npos) << s;
  EXPECT_NE(s.find("'a' 'b' 2"), std::string::npos) << s;
  EXPECT_NE(s.find("set cov['a'] := 'b';"), std::string::npos) << s;
  EXPECT_NE(s.find("param Q := 10;"), std::string::npos) << s;
  // And GLPK solves a program built from it.
  const std::string prog =
      "set I; set arcs within I cross I; param w{I} default 0; param c{I,I} default 0; set cov{I} within I;\n"
      "param Q; var x{I} >= 0, <= Q; maximize z: sum{i in I} (w[i] + 1) * x[i];\n" +
      s + "end;\n";
  const auto r = solve_mathprog(prog, 10);
  ASSERT_EQ(r.status, SolveStatus::Optimal) << r.message;
  EXPECT_NEAR(r.objective, 2.5 * 10 + 1 * 10, 1e-9);
}

TEST(OrdataDecontam, PlantedBenchmarkQuestionIsCaught) {
  const auto dir = trex::shared_dir() / "benchmarks";
  if (!std::filesystem::exists(dir / "nl4opt_289.jsonl")) GTEST_SKIP() << "no shared benchmarks";
  BenchmarkIndex index(8);
  ASSERT_GT(index.add_dir(dir), 1000u);
  std::ifstream f(dir / "nl4opt_289.jsonl");
  std::string line;
  std::getline(f, line);
  const std::string q = nlohmann::json::parse(line)["question"];
  const Overlap planted = index.score("Here is a problem. " + q);
  EXPECT_GT(planted.containment, 0.9);
  EXPECT_EQ(planted.benchmark, "nl4opt_289") ;
  // A generated question scores low.
  const Instance in = make(find_family("transportation"), 1, Difficulty::Small);
  EXPECT_LT(index.score(problem_statement(in, Representation::Inline)).containment, 0.25);
}

TEST(OrdataCorpus, NormaliseFilterAndNearDuplicates) {
  EXPECT_EQ(normalize_text("a\r\nb  c\t d\n\n\n\ne  \n"), "a\nb c d\n\ne");
  EXPECT_EQ(normalize_text("    indented   code"), "    indented code");
  std::string base;
  for (int i = 0; i < 60; ++i) base += "word" + std::to_string(i) + " in a sentence about linear programming. ";
  std::string near = base;
  near.replace(near.find("word30"), 6, "wordXX");
  std::string other;
  for (int i = 0; i < 60; ++i) other += "token" + std::to_string(i * 7) + " describes inventory dynamics here. ";
  size_t dropped = 0;
  const auto keep = near_duplicate_filter({base, near, other}, 0.8, 32, &dropped);
  EXPECT_TRUE(keep[0]);
  EXPECT_FALSE(keep[1]);
  EXPECT_TRUE(keep[2]);
  EXPECT_EQ(dropped, 1u);
  CorpusStats st;
  const auto out = clean_corpus({base, base, near, other, "too short", std::string(300, '7')}, st);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(st.exact_duplicates, 1u);
  EXPECT_EQ(st.near_duplicates, 1u);
  EXPECT_EQ(st.quality_rejects["too_short"], 1u);
  EXPECT_EQ(st.quality_rejects["low_alpha_ratio"], 1u);
}

TEST(OrdataCli, GenerateIsDeterministicAndComplete) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("trex_ordata_test_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string ingest = (tmp / "domain.jsonl").string();
  std::string doc;
  for (int i = 0; i < 30; ++i) doc += "Safety stock protects a warehouse against demand variability number " + std::to_string(i) + ".\n";
  const std::string line_json = nlohmann::json{{"text", doc}}.dump() + "\n";
  trex::write_text_atomic(ingest, line_json + line_json);
  // The LP-structure answers run in the jail; where none can be built here they run unisolated (they are
  // the generator's own programs; test_ordata_lp_answer.cpp covers the jailed check).
  const std::string isolation = trex::orkit::eval::jail_support().ok ? "" : " --unsafe-no-sandbox";
  auto run = [&](const std::string& out, int workers) {
    const std::string cmd = std::string(TREX_BINARY) + " ordata generate --n 24 --seed 5 --no-progress --workers " +
                            std::to_string(workers) + isolation + " --out " + out + " --ingest " + ingest +
                            " 2>/dev/null";
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(run((tmp / "a").string(), 2), 0);
  ASSERT_EQ(run((tmp / "b").string(), 1), 0);
  for (const char* f : {"sft.jsonl", "cpt.jsonl", "stats.json", "report.html"}) {
    ASSERT_TRUE(fs::exists(tmp / "a" / f)) << f;
    EXPECT_EQ(trex::read_text_file(tmp / "a" / f), trex::read_text_file(tmp / "b" / f)) << f;
  }
  std::ifstream in(tmp / "a" / "sft.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    for (const char* k : {"messages", "lp", "objective", "status", "family", "category", "representation",
                          "difficulty", "problem_class", "seed"})
      EXPECT_TRUE(j.contains(k)) << k;
    if (j["status"] == "optimal") {
      EXPECT_EQ(recheck_lp(j["lp"], "optimal", j["objective"].get<double>()), "");
    } else {
      EXPECT_TRUE(j["objective"].is_null());
    }
    ++n;
  }
  EXPECT_EQ(n, 24);
  const auto stats = trex::read_json_file(tmp / "a" / "stats.json");
  EXPECT_EQ(stats["kept"], 24);
  EXPECT_GE(stats["cpt"]["ingested_documents"].get<int>(), 1);
  EXPECT_GE(stats["cpt"]["exact_duplicates"].get<int>(), 1);  // the ingested text repeats itself
  fs::remove_all(tmp);
}
