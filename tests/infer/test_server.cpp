// Loopback tests of `trex serve`'s server (in process) on the tiny fixture model with a small BPE tokenizer
// trained here: a bounded load test (40 requests, 8 at a time, streamed and not) that must leave no errors,
// no busy slots and flat memory, plus the error paths (bad JSON, missing messages, over-long prompts, bad
// fields, a client that disconnects mid-stream).
#ifdef TREX_HAVE_HTTPLIB
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "data/bpe_trainer.h"
#include "infer/chat_server.h"
#include "infer/engine.h"
#include "infer_test_util.h"

using namespace trex;
using namespace trex::infer;
using json = nlohmann::json;

namespace {

constexpr int64_t kSlots = 8, kContext = 1024;

int64_t rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data::BpeTrainOptions bo;
    bo.vocab_size = 320;  // = the tiny model's vocabulary: 6 specials + 256 bytes + 58 merges
    data::BpeTrainer trainer(bo);
    for (int i = 0; i < 50; ++i)
      trainer.add_text(
          "minimise the total cost subject to the capacity of each warehouse and the demand of "
          "each customer; the optimal solution is the one with the lowest objective value. ");
    tok_ = new data::Tokenizer(trainer.train());
    model_ = infer::load_inference_model(test::dsv4_fixture("tiny"));
    sched_ = new Scheduler(make_cpu_engine(model_, kSlots, kContext));
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.default_max_tokens = 8;
    server_ = new ChatServer(*sched_, tok_, o);
    port_ = server_->bind();
    thread_ = new std::thread([] { server_->run(); });
    // Wait until it answers.
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 100 && !c.Get("/health"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  static void TearDownTestSuite() {
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete sched_;
    delete tok_;
    model_.reset();
  }

  static httplib::Result post(const json& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c.Post("/v1/chat/completions", body.dump(), "application/json");
  }
  static json metrics() {  // the sample lines of /metrics as {"name{labels}": value}
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    json m = json::object();
    std::istringstream in(r ? r->body : "");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      const size_t sp = line.rfind(' ');
      m[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    }
    return m;
  }
  static bool wait_idle(double seconds) {
    for (int i = 0; i < int(seconds * 50); ++i) {
      const json m = metrics();
      if (m["trex_active_slots"] == 0 && m["trex_queued_requests"] == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  static json chat(const std::string& text, int64_t max_tokens, uint64_t seed, bool stream = false) {
    return {{"model", "tiny"},
            {"messages", json::array({{{"role", "user"}, {"content", text}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0.8},
            {"seed", seed},
            {"stream", stream}};
  }
  // Parses an SSE body: the JSON of every "data:" line before [DONE]; done_seen tells whether it ended.
  static std::vector<json> sse_events(const std::string& body, bool* done_seen) {
    std::vector<json> ev;
    *done_seen = false;
    std::istringstream in(body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("data: ", 0) != 0) continue;
      const std::string payload = line.substr(6);
      if (payload == "[DONE]") {
        *done_seen = true;
        break;
      }
      ev.push_back(json::parse(payload));
    }
    return ev;
  }

  static inline data::Tokenizer* tok_ = nullptr;
  static inline std::shared_ptr<dsv4::Model<float>> model_;
  static inline Scheduler* sched_ = nullptr;
  static inline ChatServer* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  static inline int port_ = 0;
};

TEST_F(ServerTest, ModelsHealthAndMetricsEndpoints) {
  httplib::Client c("127.0.0.1", port_);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  const json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  const json mt = metrics();
  EXPECT_EQ(mt["trex_slots"], double(kSlots));
  EXPECT_TRUE(mt.contains("trex_requests_total{outcome=\"finished\"}"));
  auto nf = c.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(json::parse(nf->body).contains("error"));
}

TEST_F(ServerTest, SeededCompletionIsReproducibleAndStreamingMatches) {
  const json body = chat("what is the optimal cost?", 6, 77);
  auto a = post(body), b = post(body);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200) << a->body;
  const json ja = json::parse(a->body), jb = json::parse(b->body);
  EXPECT_EQ(ja["object"], "chat.completion");
  EXPECT_EQ(ja["choices"][0]["message"]["content"], jb["choices"][0]["message"]["content"]);
  EXPECT_EQ(ja["choices"][0]["token_ids"], jb["choices"][0]["token_ids"]);
  const int64_t n = ja["usage"]["completion_tokens"];
  EXPECT_LE(n, 6);
  EXPECT_EQ(ja["choices"][0]["token_ids"].size(), size_t(n));
  EXPECT_EQ(ja["usage"]["total_tokens"], ja["usage"]["prompt_tokens"].get<int64_t>() + n);
  // The decoded ids are the content (non-thinking mode); bytes that are not UTF-8 arrive as U+FFFD.
  const std::string decoded = tok_->decode(ja["choices"][0]["token_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(
      json::parse(json(decoded).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>(),
      ja["choices"][0]["message"]["content"].get<std::string>());

  json sb = body;
  sb["stream"] = true;
  sb["stream_options"] = {{"include_usage", true}};
  auto s = post(sb);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  EXPECT_NE(s->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  bool done = false;
  const auto ev = sse_events(s->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(ev.size(), 3u);
  std::string text;
  std::string reason;
  for (const auto& e : ev) {
    if (e["choices"].empty()) {  // the usage chunk
      EXPECT_EQ(e["usage"]["completion_tokens"], n);
      continue;
    }
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) reason = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(text, ja["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(reason, ja["choices"][0]["finish_reason"].get<std::string>());
}

TEST_F(ServerTest, ThinkingModeAndIdsOnlyPrompts) {
  json body = chat("plan the route", 5, 3);
  body["chat_template_kwargs"] = {{"thinking", true}};
  auto r = post(body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_TRUE(j["choices"][0]["message"].contains("reasoning_content"));
  // The prompt of thinking mode ends in <think>, the chat-mode one in </think>: one token either way.
  json plain = chat("plan the route", 5, 3);
  const json jp = json::parse(post(plain)->body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], jp["usage"]["prompt_tokens"]);

  json ids = {{"prompt_token_ids", {0, 17, 99, 23}}, {"max_tokens", 4}, {"temperature", 0}};
  auto ri = post(ids);
  ASSERT_TRUE(ri);
  ASSERT_EQ(ri->status, 200) << ri->body;
  EXPECT_EQ(json::parse(ri->body)["usage"]["prompt_tokens"], 4);
}

TEST_F(ServerTest, BadRequestsGetOpenAiStyle400s) {
  auto expect_400 = [&](const std::string& raw, const std::string& param, const std::string& code = "") {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Post("/v1/chat/completions", raw, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << raw;
    const json j = json::parse(r->body);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
    if (!code.empty()) {
      EXPECT_EQ(j["error"]["code"], code) << r->body;
    }
  };
  expect_400("{not json", "");
  expect_400(R"({"model": "tiny"})", "messages");
  expect_400(R"({"messages": []})", "messages");
  expect_400(R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})", "temperature");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"})", "max_tokens");
  expect_400(R"({"messages": [{"role": "user", "content": "x"}], "stop": 5})", "stop");
  // Over-long prompts are refused with the OpenAI code; so is a completion that would not fit.
  std::string long_text;
  for (int i = 0; i < 400; ++i) long_text += "warehouse " + std::to_string(i) + " ";
  expect_400(chat(long_text, 4, 1).dump(), "messages", "context_length_exceeded");
  expect_400(json({{"prompt_token_ids", std::vector<int>(kContext + 5, 7)}}).dump(), "prompt_token_ids",
             "context_length_exceeded");
  expect_400(chat("short", kContext, 1).dump(), "max_tokens", "context_length_exceeded");
  expect_400(json({{"prompt_token_ids", {0, 5000}}, {"max_tokens", 2}}).dump(), "prompt_token_ids");  // outside the vocab
  EXPECT_TRUE(wait_idle(5));
}

TEST_F(ServerTest, ClientDisconnectMidStreamFreesTheSlot) {
  const json before = metrics();
  json body = chat("the demand of each customer", kContext - 64, 5, true);
  body["temperature"] = 1.0;
  body["ignore_eos"] = true;  // it must still be running when the client leaves
  httplib::Client c("127.0.0.1", port_);
  int chunks = 0;
  // Read two chunks, then drop the connection.
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  c.stop();
  ASSERT_TRUE(wait_idle(20)) << "the slot of a disconnected client must be freed";
  const json after = metrics();
  EXPECT_GE(after["trex_requests_total{outcome=\"cancelled\"}"].get<double>(),
            before["trex_requests_total{outcome=\"cancelled\"}"].get<double>() + 1);
  // It stopped early: far fewer tokens than it asked for.
  EXPECT_LT(after["trex_completion_tokens_total"].get<double>() -
                before["trex_completion_tokens_total"].get<double>(),
            double(kContext - 64));
}

TEST_F(ServerTest, LoadTestNoErrorsNoLeakedSlotsFlatMemory) {
  auto run_batch = [&](int n_requests, int concurrency, std::atomic<int>& errors,
                       std::atomic<int64_t>& tokens) {
    std::atomic<int> next{0};
    std::vector<std::thread> th;
    for (int w = 0; w < concurrency; ++w)
      th.emplace_back([&] {
        for (int i; (i = next++) < n_requests;) {
          const bool stream = i % 2 == 1;
          const json body =
              chat("minimise cost for customer " + std::to_string(i), 3 + i % 4, uint64_t(i), stream);
          auto r = post(body);
          if (!r || r->status != 200) {
            ++errors;
            continue;
          }
          if (!stream) {
            const json j = json::parse(r->body);
            const std::string fr = j["choices"][0]["finish_reason"];
            if (fr != "stop" && fr != "length") ++errors;
            tokens += j["usage"]["completion_tokens"].get<int64_t>();
          } else {
            bool done = false;
            const auto ev = sse_events(r->body, &done);
            if (!done || ev.empty()) ++errors;
            int finals = 0;
            for (const auto& e : ev)
              if (!e["choices"].empty() && !e["choices"][0]["finish_reason"].is_null()) ++finals;
            if (finals != 1) ++errors;
          }
        }
      });
    for (auto& t : th) t.join();
  };
  std::atomic<int> errors{0};
  std::atomic<int64_t> tokens{0};
  run_batch(16, 8, errors, tokens);  // warm-up: allocator pools, thread stacks, caches at full batch
  ASSERT_EQ(errors.load(), 0);
  ASSERT_TRUE(wait_idle(10));
  const int64_t rss0 = rss_kb();
  const json m0 = metrics();
  const auto t0 = std::chrono::steady_clock::now();
  run_batch(40, 8, errors, tokens);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(errors.load(), 0);
  ASSERT_TRUE(wait_idle(10)) << "slots leaked";
  const json m1 = metrics();
  const int64_t rss1 = rss_kb();
  EXPECT_EQ(m1["trex_requests_total{outcome=\"failed\"}"], m0["trex_requests_total{outcome=\"failed\"}"]);
  EXPECT_EQ(m1["trex_requests_total{outcome=\"finished\"}"].get<double>() -
                m0["trex_requests_total{outcome=\"finished\"}"].get<double>(),
            40.0);
  EXPECT_GT(m1["trex_completion_tokens_total"].get<double>(),
            m0["trex_completion_tokens_total"].get<double>());
  EXPECT_LT(rss1 - rss0, 16 * 1024) << "RSS grew from " << rss0 << " kB to " << rss1 << " kB";
  EXPECT_LT(secs, 60.0);
  std::printf("load test: 40 requests, 8 concurrent, %.2f s, RSS %lld -> %lld kB\n", secs, (long long)rss0,
              (long long)rss1);
}

}  // namespace
#endif  // TREX_HAVE_HTTPLIB
