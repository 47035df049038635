// OR data generator, part 2: the SFT answers run in the evaluation's format (gurobipy-style <python> code
// executed through python/trex_solvers reproduces the verified objective, for every category with code
// and for data.json and CSV attachments), answer cleaning, and the self-distillation loop against a mock
// OpenAI-compatible teacher on 127.0.0.1 that answers some items correctly and some wrongly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/files.h"
#include "orkit/eval/execute.h"
#include "orkit/gen/distill.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/render.h"
#include "orkit/gen/verify.h"

#ifdef TREX_HAVE_HTTPLIB
#include <httplib.h>

#include <atomic>
#include <mutex>
#include <thread>
#endif

using namespace trex::orkit;
using namespace trex::orkit::gen;
namespace fs = std::filesystem;

namespace {

struct Spec {
  std::string family;
  uint64_t seed;
  Category cat;
  Representation rep;
  AttachFormat attach = AttachFormat::Json;
  Expected target = Expected::Optimal;
};

// A sample shaped like the pipeline's (messages, files, status, objective, category, ...).
json make_sample(const Spec& s, int index) {
  Rng rng(s.seed);
  GenRequest req;
  req.difficulty = Difficulty::Small;
  req.target = s.target;
  const Instance in = find_family(s.family).generate(rng, req);
  const Verdict v = verify_instance(in);
  EXPECT_TRUE(v.ok) << s.family << ": " << v.reason << " " << v.detail;
  const Rendered rd = render(in, s.cat, s.rep, rng, s.attach);
  json j;
  j["id"] = fmt::format("test-{}", index);
  j["messages"] = rd.messages;
  if (!rd.files.empty()) j["files"] = rd.files;
  j["lp"] = v.lp;
  j["status"] = expected_name(in.expected);
  j["objective"] = in.expected == Expected::Optimal ? json(v.objective) : json(nullptr);
  j["family"] = in.family;
  j["category"] = category_name(s.cat);
  j["representation"] = representation_name(s.rep);
  return j;
}

std::string assistant(const json& sample) {
  return sample["messages"].back()["content"].get<std::string>();
}

// Why the Python side cannot run here, or "" when it can.
std::string python_side_missing() {
  const fs::path pkg = eval::default_python_pkg();
  if (!fs::exists(pkg / "gurobipy.py") || !fs::exists(pkg / "_trex_run.py"))
    return "python/trex_solvers (gurobipy look-alike and runner) not found at " + pkg.string();
  try {
    (void)eval::find_python("");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

DistillOptions run_options() {
  DistillOptions o;
  o.trex_bin = TREX_BINARY;
  o.exec_timeout_s = 60;
  o.progress = false;
  return o;
}

}  // namespace

TEST(OrdataAnswers, CleanAnswerNormalisesTags) {
  const auto a = clean_answer(
      "Sure! Let me help.\n<THINK>\nplan it\n</THINK>\n<Model>\nmax x\n</Model>\n<python>\n"
      "```python\nprint(1)\n```\n</python>\nHope this helps.");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->text(), "<think>\nplan it\n</think>\n<model>\nmax x\n</model>\n<python>\nprint(1)\n</python>");
  const auto b =
      clean_answer("reasoning only</think>\nHere:\n```python\nimport gurobipy\nmodel = 1\n```\nDone.");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->think, "reasoning only");
  EXPECT_EQ(b->code, "import gurobipy\nmodel = 1");
  const auto c = clean_answer("<think>x</think>\n```lp\nMinimize\n obj: x\nEnd\n```");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->lp);
  EXPECT_FALSE(clean_answer("I cannot answer that."));
}

// Item 5 of the issue: the SFT answers are runnable in the evaluation's format.
TEST(OrdataAnswers, GeneratedPythonReproducesVerifiedObjective) {
  if (const std::string why = python_side_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<Spec> specs = {
      {"production_planning", 11, Category::Formulation, Representation::Inline},
      {"portfolio", 3, Category::SolverCode, Representation::Table},
      {"transshipment", 5, Category::ExternalData, Representation::Attached, AttachFormat::Json},
      {"staff_assignment", 6, Category::ExternalData, Representation::Attached, AttachFormat::Csv},
      {"multi_commodity_flow", 2, Category::Formulation, Representation::Attached, AttachFormat::Csv},
      {"vrp", 4, Category::SolverCode, Representation::Inline},
      {"diet", 7, Category::SolverCode, Representation::Table, AttachFormat::Json, Expected::Infeasible},
  };
  const DistillOptions o = run_options();
  int i = 0;
  for (const auto& s : specs) {
    const json sample = make_sample(s, i++);
    const auto clean = clean_answer(assistant(sample));
    ASSERT_TRUE(clean) << s.family;
    ASSERT_FALSE(clean->lp);
    const json run = run_python_answer(clean->code, sample.value("files", json::object()), o, 0);
    SCOPED_TRACE(s.family + " " + category_name(s.cat) + " " + attach_format_name(s.attach));
    ASSERT_EQ(run["status"], sample["status"]) << run.dump();
    if (sample["status"] == "optimal") {
      ASSERT_TRUE(run["objective"].is_number()) << run.dump();
      EXPECT_TRUE(objectives_agree(run["objective"].get<double>(), sample["objective"].get<double>(), 1e-6))
          << run["objective"] << " vs " << sample["objective"];
    }
  }
}

TEST(OrdataAnswers, WrongProgramIsDetected) {
  if (const std::string why = python_side_missing(); !why.empty()) GTEST_SKIP() << why;
  const json sample = make_sample({"knapsack", 5, Category::SolverCode, Representation::Inline}, 0);
  std::string code = clean_answer(assistant(sample))->code;
  // Plant a wrong model: an extra row (at most one item in total) changes the optimum.
  const size_t at = code.find("model.optimize()");
  ASSERT_NE(at, std::string::npos);
  code.insert(at, "model.addConstr(gp.quicksum(v for v in model.getVars()) <= 1, name=\"planted\")\n");
  const json run = run_python_answer(code, json::object(), run_options(), 0);
  ASSERT_EQ(run["status"], "optimal") << run.dump();
  EXPECT_FALSE(objectives_agree(run["objective"].get<double>(), sample["objective"].get<double>(), 1e-6));
}

#ifdef TREX_HAVE_HTTPLIB
namespace {

// Mock teacher: item i answers (by i % 3) 0: correctly, wrapped in chatter with upper-case tags;
// 1: a runnable but wrong program; 2: first no code at all, then the correct answer.
class MockTeacher {
 public:
  explicit MockTeacher(std::vector<json> samples) : samples_(std::move(samples)) {
    srv_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (++requests_ > 50) {  // bounded: a runaway client fails the test instead of spinning
        res.status = 400;
        return;
      }
      const json body = json::parse(req.body);
      const std::string user = body["messages"].back()["content"];
      int idx = -1;
      for (size_t i = 0; i < samples_.size(); ++i)
        for (const auto& m : samples_[i]["messages"])
          if (m["role"] == "user" && m["content"] == user) idx = static_cast<int>(i);
      if (idx < 0) {
        res.status = 404;
        return;
      }
      int seen;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen = ++per_item_[idx];
      }
      const std::string good = assistant(samples_[idx]);
      std::string content;
      switch (idx % 3) {
        case 0: {
          std::string shouty = good;
          for (const char* t : {"think>", "model>"}) {
            const std::string up = std::string(t) == "think>" ? "THINK>" : "MODEL>";
            for (size_t p = shouty.find(t); p != std::string::npos; p = shouty.find(t, p + 1))
              shouty.replace(p, 6, up);
          }
          content =
              "Sure! Here is a careful answer.\n\n" + shouty + "\n\nLet me know if you need anything else.";
          break;
        }
        case 1:
          content =
              "<think>\nA quick model.\n</think>\n<python>\nimport gurobipy as gp\nfrom gurobipy import GRB\n"
              "model = gp.Model()\nx = model.addVar(lb=0, ub=1, name=\"x\")\n"
              "model.setObjective(x + 12345.5, GRB.MAXIMIZE)\nmodel.optimize()\n</python>";
          break;
        default:
          content = seen == 1 ? "I am not able to write code for this." : good;
      }
      json out{{"id", "mock"},
               {"choices", json::array({{{"index", 0},
                                         {"message", {{"role", "assistant"}, {"content", content}}},
                                         {"finish_reason", "stop"}}})},
               {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 10}, {"total_tokens", 20}}}};
      res.set_content(out.dump(), "application/json");
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~MockTeacher() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int requests() const { return requests_; }

 private:
  std::vector<json> samples_;
  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> requests_{0};
  std::mutex mu_;
  std::map<int, int> per_item_;
};

}  // namespace

TEST(OrdataDistill, MockTeacherRejectionSampling) {
  if (const std::string why = python_side_missing(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<Spec> specs = {
      {"production_planning", 11, Category::Formulation, Representation::Inline},
      {"transportation", 3, Category::SolverCode, Representation::Table},
      {"diet", 7, Category::SolverCode, Representation::Inline, AttachFormat::Json, Expected::Infeasible},
      {"knapsack", 5, Category::LpStructure, Representation::Table},
      {"transshipment", 5, Category::ExternalData, Representation::Attached, AttachFormat::Csv},
      {"crop_planning", 2, Category::ExternalData, Representation::Attached, AttachFormat::Json},
  };
  std::vector<json> samples;
  for (size_t i = 0; i < specs.size(); ++i) samples.push_back(make_sample(specs[i], static_cast<int>(i)));
  const fs::path tmp = fs::temp_directory_path() / ("trex_distill_test_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::string lines;
  for (const auto& s : samples) lines += s.dump() + "\n";
  trex::write_text_atomic(tmp / "sft.jsonl", lines);

  MockTeacher teacher(samples);
  DistillOptions o = run_options();
  o.in = tmp / "sft.jsonl";
  o.out = tmp / "out";
  o.base_url = teacher.url();
  o.model = "mock-teacher";
  o.samples = 2;
  o.workers = 2;
  o.max_attempts = 1;
  const DistillSummary s = distill(o);
  EXPECT_EQ(s.items, 6);
  EXPECT_EQ(s.kept, 4);               // items 0, 2, 3, 5
  EXPECT_EQ(teacher.requests(), 10);  // 1 + 2 + 2 + 1 + 2 + 2: the loop stops at the first pass
  EXPECT_EQ(s.rejected.at("objective_mismatch"), 4);
  EXPECT_EQ(s.rejected.at("no_code"), 2);
  std::ifstream f(tmp / "out" / "sft.jsonl");
  std::string line;
  std::vector<std::string> kept_ids;
  while (std::getline(f, line)) {
    const json j = json::parse(line);
    kept_ids.push_back(j["id"]);
    const std::string a = assistant(j);
    EXPECT_EQ(a.rfind("<think>\n", 0), 0u) << a.substr(0, 80);  // chatter before the tags is gone
    EXPECT_EQ(a.find("Sure!"), std::string::npos);
    EXPECT_EQ(a.find("Let me know"), std::string::npos);
    EXPECT_EQ(a.find("THINK"), std::string::npos);
    if (j["category"] == "lp_structure") {  // the program that writes the LP file, checked by ORGEval
      EXPECT_NE(a.find("model.write(\"knapsack.lp\")"), std::string::npos);
      EXPECT_EQ(j["distill"]["lp_answer"], "orgeval_equivalent");
    } else {
      EXPECT_NE(a.find("<python>\n"), std::string::npos);
    }
    EXPECT_EQ(j["distill"]["teacher"], "mock-teacher");
  }
  EXPECT_EQ(kept_ids, (std::vector<std::string>{"test-0-distill", "test-2-distill", "test-3-distill",
                                                "test-5-distill"}));
  const auto stats = trex::read_json_file(tmp / "out" / "distill_stats.json");
  EXPECT_EQ(stats["kept"], 4);
  EXPECT_EQ(stats["answers"], 10);
  fs::remove_all(tmp);
}
#endif
