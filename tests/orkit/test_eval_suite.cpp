// `trex eval suite` end to end against a loopback stub of an OpenAI-compatible server: four tiny sets
// (two items each, from the real benchmark files), n = 2 samples per item. The stub honours `n` for the
// NL4OPT and OptiBench prompts and ignores it (one choice) for the Bench4Opt ones, so both paths run: one
// request with n = 2, or the fall-back of a second request with seed + 1. Its answers are the held-out
// correct answers at seed 42 (choice 0) and a wrong one otherwise, so every item has c = 1 of n = 2:
// Pass@1 = 50 %, Pass@2 = 100 % on every set, exactly.
#include <gtest/gtest.h>

#ifdef TREX_HAVE_HTTPLIB
#include <httplib.h>

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "core/files.h"
#include "orkit/eval/suite.h"

using namespace trex::orkit::eval;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Tiny {
  std::string stem;
  std::vector<std::string> ids;
};
const std::vector<Tiny> kSets{{"nl4opt_289", {"nl4opt289_000", "nl4opt289_003"}},
                              {"optibench", {"optibench_002", "optibench_003"}},
                              {"bench4opt_feasible", {"b4o_feasible_BENCH4OPT_2", "b4o_feasible_BENCH4OPT_132"}},
                              {"bench4opt_orgeval", {"b4o_orgeval_BENCH4OPT_0", "b4o_orgeval_BENCH4OPT_67"}}};

class Stub {
 public:
  // question text -> (correct answer, honour n)
  explicit Stub(std::vector<std::tuple<std::string, std::string, bool>> items) : items_(std::move(items)) {
    srv_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      if (++requests_ > 100) {
        res.status = 400;
        return;
      }
      const json body = json::parse(req.body);
      const std::string user = body["messages"].back()["content"];
      const int n = body.value("n", 1), seed = body.value("seed", 0);
      const std::tuple<std::string, std::string, bool>* hit = nullptr;
      for (const auto& it : items_)
        if (user.find(std::get<0>(it)) != std::string::npos) hit = &it;
      if (!hit) {
        res.status = 404;
        return;
      }
      if (n > 1) ++n_requests_;
      const int choices = std::get<2>(*hit) ? n : 1;
      json out{{"id", "stub"}, {"choices", json::array()}, {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 5}}}};
      for (int c = 0; c < choices; ++c) {
        const bool right = seed == 42 && c == 0;
        out["choices"].push_back({{"index", c},
                                  {"message", {{"role", "assistant"}, {"content", right ? std::get<1>(*hit) : "I cannot say."}}},
                                  {"finish_reason", "stop"}});
      }
      res.set_content(out.dump(), "application/json");
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~Stub() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int requests() const { return requests_; }
  int n_requests() const { return n_requests_; }

 private:
  std::vector<std::tuple<std::string, std::string, bool>> items_;
  httplib::Server srv_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> requests_{0}, n_requests_{0};
};

}  // namespace

TEST(EvalSuite, FourSetTableWithPassAtKFromAStubServer) {
  const fs::path shared = trex::shared_dir() / "benchmarks";
  if (!fs::exists(shared / "nl4opt_289.jsonl")) GTEST_SKIP() << "no shared benchmarks";
  std::string t = (fs::temp_directory_path() / "trex-suite-XXXXXX").string();
  const fs::path dir = mkdtemp(t.data());
  const fs::path benches = dir / "benchmarks";
  fs::create_directories(benches);
  std::vector<std::tuple<std::string, std::string, bool>> stub_items;
  for (const Tiny& set : kSets) {
    std::string lines;
    std::ifstream in(shared / (set.stem + ".jsonl"));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      const std::string id = j["id"];
      if (std::find(set.ids.begin(), set.ids.end(), id) == set.ids.end()) continue;
      lines += line + "\n";
      const std::string q = j["question"];
      stub_items.emplace_back(q.substr(0, std::min<size_t>(q.size(), 400)),
                              trex::read_text_file(trex::source_dir() / "tests" / "data" / "eval" / "answers" /
                                                   set.stem / (id + ".md")),
                              set.stem == "nl4opt_289" || set.stem == "optibench");
    }
    trex::write_text_atomic(benches / (set.stem + ".jsonl"), lines);
  }
  ASSERT_EQ(stub_items.size(), 8u);
  Stub stub(stub_items);
  const fs::path out = dir / "out";
  const std::string cmd = std::string(TREX_BINARY) + " eval suite --benchmarks-dir " + benches.string() +
                          " --base-url " + stub.url() + " --model stub --samples 2 --k 1 --k 2 --concurrency 2" +
                          " --jobs 2 --no-progress --retries 1 --out " + out.string() + " > " + (dir / "log").string() +
                          " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << trex::read_text_file(dir / "log");
  // 4 items honour n (one request each), 4 do not (the n request, then one with seed 43)
  EXPECT_EQ(stub.requests(), 4 + 4 * 2);
  EXPECT_EQ(stub.n_requests(), 8);
  const json suite = trex::read_json_file(out / "suite.json");
  ASSERT_EQ(suite["sets"].size(), 4u);
  const char* labels[] = {"NL4OPT-289", "OptiBench-600", "B4O-Feasible", "B4O-ORGEval"};
  for (int i = 0; i < 4; ++i) {
    const json& s = suite["sets"][i];
    EXPECT_EQ(s["label"], labels[i]);
    EXPECT_EQ(s["items"], 2);
    EXPECT_DOUBLE_EQ(s["pass_at"]["pass@1"].get<double>(), 50.0) << labels[i] << "\n" << s.dump();
    EXPECT_DOUBLE_EQ(s["pass_at"]["pass@2"].get<double>(), 100.0) << labels[i];
  }
  EXPECT_DOUBLE_EQ(suite["average"]["pass@1"].get<double>(), 50.0);
  const std::string html = trex::read_text_file(out / "suite.html");
  for (const char* l : labels) EXPECT_NE(html.find(l), std::string::npos) << l;
  EXPECT_NE(html.find("<th>Pass@2</th>"), std::string::npos);
  EXPECT_NE(html.find("<th>100.00</th>"), std::string::npos);  // Average Pass@2
  // one line per item and sample, with the deciding solver for the objective items that solved
  int lines = 0;
  std::ifstream samples(out / "samples.jsonl");
  for (std::string line; std::getline(samples, line);) {
    const json j = json::parse(line);
    EXPECT_TRUE(j.contains("solver"));
    ++lines;
  }
  EXPECT_EQ(lines, 16);
  // a second run is served from the cache: no request
  const int before = stub.requests();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << trex::read_text_file(dir / "log");
  EXPECT_EQ(stub.requests(), before);
  fs::remove_all(dir);
}

#endif
