// trex eval: the OpenAI-compatible client against a real HTTP server on 127.0.0.1 (success, retries on
// 5xx / 429 / time-outs, no retry on 4xx, usage) and the response cache that lets a run resume.
#include <gtest/gtest.h>

#ifdef TREX_HAVE_HTTPLIB
#include <httplib.h>
#include <stdlib.h>

#include <atomic>
#include <thread>

#include "orkit/eval/generate.h"

using namespace trex::orkit::eval;
using nlohmann::json;

namespace {

// A loopback mock of /v1/chat/completions whose behaviour depends on the requested model name.
class MockServer {
 public:
  MockServer() {
    srv_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const int n = ++requests_;
      if (n > 200) {  // bounded: a runaway client fails the test instead of spinning
        res.status = 400;
        return;
      }
      const json body = json::parse(req.body);
      last_body_ = body;
      last_auth_ = req.get_header_value("Authorization");
      const std::string model = body["model"];
      const int seen = ++per_model_[model == "flaky"       ? 0
                                    : model == "slow"      ? 1
                                    : model == "ratelimit" ? 2
                                                           : 3];
      if (model == "flaky" && seen <= 2) {
        res.status = 503;
        res.set_content("{\"error\": \"overloaded\"}", "application/json");
        return;
      }
      if (model == "ratelimit" && seen == 1) {
        res.status = 429;
        return;
      }
      if (model == "bad") {
        res.status = 400;
        res.set_content("{\"error\": \"bad request\"}", "application/json");
        return;
      }
      if (model == "slow" && seen == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      const std::string user = body["messages"].back()["content"];
      json out{
          {"id", "x"},
          {"choices",
           json::array({{{"index", 0},
                         {"message",
                          {{"role", "assistant"},
                           {"content", "echo: " + user.substr(user.size() > 60 ? user.size() - 60 : 0)}}},
                         {"finish_reason", "stop"}}})},
          {"usage", {{"prompt_tokens", 11}, {"completion_tokens", 7}, {"total_tokens", 18}}}};
      res.set_content(out.dump(), "application/json");
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~MockServer() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int requests() const { return requests_; }
  json last_body_;
  std::string last_auth_;

 private:
  httplib::Server srv_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> requests_{0};
  std::atomic<int> per_model_[4] = {0, 0, 0, 0};
};

ClientOptions opts(const MockServer& s, const std::string& model) {
  ClientOptions o;
  o.base_url = s.url();
  o.model = model;
  o.api_key_env = "TREX_TEST_API_KEY";
  o.backoff_seconds = 0.05;
  o.max_attempts = 4;
  o.timeout_seconds = 5;
  return o;
}

const std::vector<ChatMessage> kMsgs = {{"system", "sys"}, {"user", "What is the optimum?"}};

}  // namespace

TEST(EvalOpenAI, SendsSamplingSettingsAndKeyAndReadsUsage) {
  MockServer s;
  setenv("TREX_TEST_API_KEY", "sk-test", 1);
  OpenAIClient c(opts(s, "ok"));
  SamplingParams sp;
  sp.temperature = 0.6, sp.top_p = 1.0, sp.max_tokens = 9600, sp.seed = 42;
  auto r = c.chat(kMsgs, sp);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.content, "echo: What is the optimum?");
  EXPECT_EQ(r.prompt_tokens, 11);
  EXPECT_EQ(r.completion_tokens, 7);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(s.last_body_["seed"], 42);
  EXPECT_EQ(s.last_body_["max_tokens"], 9600);
  EXPECT_DOUBLE_EQ(s.last_body_["temperature"].get<double>(), 0.6);
  EXPECT_EQ(s.last_body_["messages"].size(), 2u);
  EXPECT_EQ(s.last_auth_, "Bearer sk-test");
  unsetenv("TREX_TEST_API_KEY");
}

TEST(EvalOpenAI, RetriesServerErrorsAndRateLimits) {
  MockServer s;
  auto r = OpenAIClient(opts(s, "flaky")).chat(kMsgs, {});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.attempts, 3);
  auto q = OpenAIClient(opts(s, "ratelimit")).chat(kMsgs, {});
  ASSERT_TRUE(q.ok) << q.error;
  EXPECT_EQ(q.attempts, 2);
}

TEST(EvalOpenAI, DoesNotRetryClientErrors) {
  MockServer s;
  auto r = OpenAIClient(opts(s, "bad")).chat(kMsgs, {});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.http_status, 400);
  EXPECT_NE(r.error.find("HTTP 400"), std::string::npos) << r.error;
}

TEST(EvalOpenAI, SlowResponseTimesOutThenRetries) {
  MockServer s;
  auto o = opts(s, "slow");
  o.timeout_seconds = 0.5;
  auto r = OpenAIClient(o).chat(kMsgs, {});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.attempts, 2);
}

TEST(EvalOpenAI, UnreachableServerFailsAfterAllAttempts) {
  ClientOptions o;
  o.base_url = "http://127.0.0.1:1/v1";  // nothing listens on port 1
  o.model = "m";
  o.max_attempts = 2;
  o.backoff_seconds = 0.01;
  auto r = OpenAIClient(o).chat(kMsgs, {});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.attempts, 2);
}

TEST(EvalOpenAI, CacheMakesARunResume) {
  MockServer s;
  std::string t = (std::filesystem::temp_directory_path() / "trex-cache-XXXXXX").string();
  const std::filesystem::path dir = mkdtemp(t.data());
  Benchmark b;
  b.name = "mini";
  for (int i = 0; i < 5; ++i) {
    BenchItem it;
    it.id = "q" + std::to_string(i);
    it.question = "question number " + std::to_string(i);
    it.answer = i;
    b.items.push_back(it);
  }
  GenerateOptions g;
  g.client = opts(s, "ok");
  g.concurrency = 3;
  OpenAIClient client(g.client);
  {
    ResponseCache cache(dir / "cache.jsonl");
    GenerationStats st;
    auto out = generate_responses(b, client, cache, g, false, st);
    EXPECT_EQ(out.size(), 5u);
    EXPECT_EQ(st.requests, 5);
    EXPECT_EQ(st.prompt_tokens, 55);
  }
  const int before = s.requests();
  {
    ResponseCache cache(dir / "cache.jsonl");  // a new run reads the file back
    GenerationStats st;
    auto out = generate_responses(b, client, cache, g, false, st);
    EXPECT_EQ(out.size(), 5u);
    EXPECT_EQ(st.cached, 5);
    EXPECT_EQ(st.requests, 0);
    EXPECT_NE(out["q3"].find("question number 3"), std::string::npos);
  }
  EXPECT_EQ(s.requests(), before);
  // a different sampling setting is a different key
  g.sampling.temperature = 0.0;
  {
    ResponseCache cache(dir / "cache.jsonl");
    GenerationStats st;
    generate_responses(b, client, cache, g, false, st);
    EXPECT_EQ(st.requests, 5);
  }
  std::filesystem::remove_all(dir);
}
#endif
