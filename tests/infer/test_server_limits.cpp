// Hostile clients against `trex serve` (loopback, in process, bounded in time): a 50 MB chunked body, bodies
// that must not be echoed, 200 idle connections and 40 slow clients while /health must answer within 1 s,
// the connection cap, numbers that overflow or underflow, token ids outside the vocabulary, and the memory
// left after a suite of malformed requests.
#ifdef TREX_HAVE_HTTPLIB
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include "server_test_util.h"

using namespace trex;
using namespace trex::infer;
using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return false;
    off += size_t(w);
  }
  return true;
}

// Everything the server sends until it closes or `seconds` pass.
std::string read_until_close(int fd, double seconds, bool* closed) {
  std::string out;
  *closed = false;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  char buf[4096];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r <= 0) {
      *closed = true;
      break;
    }
    out.append(buf, size_t(r));
  }
  return out;
}

class ServerLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerLimits l;
    l.header_timeout_s = 2;  // short, so that the slow-client test ends quickly
    l.body_timeout_s = 2;
    l.max_connections = 256;
    s_ = new test::TinyServer(l);
  }
  static void TearDownTestSuite() {
    delete s_;
    s_ = nullptr;
  }
  // Seconds /health takes to answer (a fresh connection), or 1e9 when it does not.
  static double health_seconds() {
    const auto t0 = Clock::now();
    httplib::Client c("127.0.0.1", s_->port);
    c.set_connection_timeout(5, 0);
    c.set_read_timeout(5, 0);
    auto r = c.Get("/health");
    if (!r || r->status != 200) return 1e9;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  static json error_of(const httplib::Result& r, int status) {
    EXPECT_TRUE(r);
    if (!r) return json::object();
    EXPECT_EQ(r->status, status) << r->body.substr(0, 300);
    const json j = json::parse(r->body);
    EXPECT_TRUE(j.contains("error"));
    return j["error"];
  }
  static inline test::TinyServer* s_ = nullptr;
};

TEST_F(ServerLimitsTest, ChunkedBodiesOverTheLimitAre413AndNothingIsEchoed) {
  // 50 MB sent chunked (no Content-Length): refused once 16 MiB have arrived.
  const int fd = connect_to(s_->port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n"));
  const std::string piece(1 << 20, 'a');
  char size_line[32];
  std::snprintf(size_line, sizeof size_line, "%zx\r\n", piece.size());
  const auto t0 = Clock::now();
  // Read while sending: the server answers before the client is done (and then stops reading).
  std::string resp;
  bool closed = false;
  std::thread reader([&] { resp = read_until_close(fd, 20, &closed); });
  for (int mb = 0; mb < 50; ++mb)
    if (!send_all(fd, size_line + piece + "\r\n")) break;
  send_all(fd, "0\r\n\r\n");
  reader.join();
  close(fd);
  EXPECT_TRUE(closed) << "the server must end the connection after refusing the body";
  EXPECT_NE(resp.find("HTTP/1.1 413"), std::string::npos) << resp.substr(0, 200);
  EXPECT_EQ(resp.find("aaaa"), std::string::npos) << "the body must not be echoed";
  EXPECT_LT(resp.size(), 2000u) << resp;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  // Same for a path without a handler, and with Content-Length (refused before it is read).
  httplib::Client c("127.0.0.1", s_->port);
  const std::string big(size_t(17) << 20, '[');
  EXPECT_EQ(error_of(c.Post("/v1/completions", big, "application/json"), 413)["code"], "request_too_large");
  // Invalid JSON whose parse error would quote it: the message is bounded and quotes nothing.
  const std::string junk = "{\"messages\": \"" + std::string(100000, 'z') + "\" zzz";
  const json e = error_of(c.Post("/v1/chat/completions", junk, "application/json"), 400);
  EXPECT_LT(e["message"].get<std::string>().size(), 500u);
  EXPECT_EQ(e["message"].get<std::string>().find("zzzz"), std::string::npos) << e["message"];
  const json e2 = error_of(c.Post("/v1/chat/completions",
                                  json({{"messages", {{{"role", std::string(100000, 'r')}, {"content", "x"}}}}}).dump(),
                                  "application/json"),
                           400);
  EXPECT_LT(e2["message"].get<std::string>().size(), 500u);
  EXPECT_LT(health_seconds(), 1.0);
}

TEST_F(ServerLimitsTest, HealthAnswersWithin1sUnder200IdleAnd40SlowConnections) {
  std::vector<int> idle, slow;
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_to(s_->port);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  for (int i = 0; i < 40; ++i) {
    const int fd = connect_to(s_->port);
    ASSERT_GE(fd, 0);
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");  // and then a byte now and then
    slow.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double worst = 0;
  for (int k = 0; k < 5; ++k) {
    for (int fd : slow) send_all(fd, "X");
    worst = std::max(worst, health_seconds());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_LT(worst, 1.0) << "/health took " << worst << " s";
  std::printf("/health under 200 idle + 40 slow connections: worst of 5 probes %.3f s\n", worst);
  // The slow clients never finish their headers: the header time-out (2 s here) ends them, though each
  // sent a byte every ~0.3 s (httplib's own time-out is per read and would never fire).
  const auto t0 = Clock::now();
  int ended = 0;
  for (int fd : slow) {
    bool closed = false;
    for (int k = 0; k < 40 && !closed; ++k) {
      send_all(fd, "Y");
      read_until_close(fd, 0.1, &closed);
    }
    ended += closed;
    close(fd);
  }
  EXPECT_EQ(ended, 40);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 6.0);
  for (int fd : idle) close(fd);
  httplib::Client c("127.0.0.1", s_->port);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("trex_connections_total{outcome=\"timed_out\"}"), std::string::npos);
}

TEST_F(ServerLimitsTest, ConnectionsBeyondTheCapGetA503AndHealthRecovers) {
  std::vector<int> held;
  for (int i = 0; i < 256; ++i) {
    const int fd = connect_to(s_->port);
    ASSERT_GE(fd, 0);
    held.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int extra = connect_to(s_->port);
  ASSERT_GE(extra, 0);
  bool closed = false;
  const std::string resp = read_until_close(extra, 3, &closed);
  close(extra);
  EXPECT_NE(resp.find("503"), std::string::npos) << "[" << resp << "] closed " << closed;
  EXPECT_TRUE(closed);
  for (int fd : held) close(fd);
  double t = 1e9;
  for (int k = 0; k < 50 && t > 1.0; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    t = health_seconds();
  }
  EXPECT_LT(t, 1.0);
}

TEST_F(ServerLimitsTest, NumbersAreRangeCheckedAndIdsCheckedAgainstTheVocabulary) {
  const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
  auto expect = [&](const std::string& path, json body, const std::string& param, const std::string& code = "") {
    if (path == "/v1/chat/completions" && !body.contains("prompt_token_ids")) body["messages"] = msgs;
    if (path == "/v1/completions" && !body.contains("prompt")) body["prompt"] = "x";
    const json e = error_of(s_->post(path, body), 400);
    EXPECT_EQ(e["param"], param) << body.dump().substr(0, 200);
    if (!code.empty()) {
      EXPECT_EQ(e["code"], code) << body.dump().substr(0, 200);
    }
  };
  for (const std::string path : {"/v1/chat/completions", "/v1/completions"}) {
    SCOPED_TRACE(path);
    expect(path, {{"max_tokens", std::numeric_limits<int64_t>::max()}}, "max_tokens", "context_length_exceeded");
    expect(path, {{"max_tokens", std::numeric_limits<uint64_t>::max()}}, "max_tokens");
    expect(path, {{"max_tokens", 1e30}}, "max_tokens");
    expect(path, {{"max_tokens", 0}}, "max_tokens");
    expect(path, {{"temperature", 1e-310}}, "temperature");
    expect(path, {{"temperature", 1e-5}}, "temperature");
    expect(path, {{"temperature", 1e300}}, "temperature");
    expect(path, {{"n", std::numeric_limits<uint64_t>::max()}}, "n");
    expect(path, {{"n", 9}}, "n");  // more than the 8 slots
    expect(path, {{"frequency_penalty", -2.5}}, "frequency_penalty");
    expect(path, {{"presence_penalty", 1e308}}, "presence_penalty");
    expect(path, {{"stop", json::array({"a", "b", "c", "d", "e"})}}, "stop");
  }
  const int64_t wraps_to_5 = (int64_t(1) << 32) + 5;
  expect("/v1/chat/completions", {{"prompt_token_ids", {0, wraps_to_5}}}, "prompt_token_ids");
  expect("/v1/chat/completions", {{"prompt_token_ids", {0, 320}}}, "prompt_token_ids");
  expect("/v1/chat/completions", {{"prompt_token_ids", {0, -1}}}, "prompt_token_ids");
  expect("/v1/chat/completions", {{"prompt_token_ids", {0, std::numeric_limits<uint64_t>::max()}}}, "prompt_token_ids");
  expect("/v1/completions", {{"prompt", {0, wraps_to_5}}}, "prompt");
  expect("/v1/completions", {{"prompt", json::array({json::array({0, 1}), json::array({0, 320})})}}, "prompt");
  expect("/v1/chat/completions", {{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs");
  expect("/v1/chat/completions", {{"top_logprobs", 2}}, "top_logprobs");  // without logprobs: true
  expect("/v1/completions", {{"logprobs", 21}}, "logprobs");
  expect("/v1/completions", {{"echo", true}}, "echo");
  // Extremes that are valid still work: the largest seed, max_tokens exactly filling the context.
  auto r = s_->post("/v1/completions", {{"prompt", {0, 1, 2}}, {"seed", std::numeric_limits<uint64_t>::max()},
                                         {"max_tokens", 3}, {"temperature", 0.001}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = s_->post("/v1/completions", {{"prompt", {0, 1, 2}}, {"max_tokens", test::TinyServer::kContext - 3}, {"n", 1},
                                    {"stop", "\x01"}, {"temperature", 0}, {"ignore_eos", false}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ServerLimitsTest, MemoryReturnsAfterTheMalformedRequestSuite) {
  // ~4 MB of ids with one outside the vocabulary at the end (a JSON tree of ~16 MB while it is parsed);
  // ~4 MB of a string that is never closed; 4 MB of '[' (a nesting bomb); a 20 MB chunked body.
  std::string ids = "{\"prompt_token_ids\": [";
  ids.reserve(size_t(7) << 20);
  for (int k = 0; k < 1000000; ++k) ids += "17, ";
  ids += "99999]}";
  const std::string open_string = "{\"prompt\": \"" + std::string(size_t(4) << 20, 'q');
  const std::string nesting(size_t(4) << 20, '[');
  auto suite = [&](int rounds) {
    std::vector<std::thread> th;
    for (int w = 0; w < 4; ++w)
      th.emplace_back([&] {
        httplib::Client c("127.0.0.1", s_->port);
        c.set_read_timeout(30, 0);
        for (int i = 0; i < rounds; ++i) {
          c.Post("/v1/chat/completions", ids, "application/json");
          c.Post("/v1/completions", open_string, "application/json");
          c.Post("/v1/completions", nesting, "application/json");
          c.Post("/v1/completions",
                 [](size_t offset, httplib::DataSink& sink) {
                   static const std::string piece(1 << 20, ' ');
                   if (offset >= (size_t(20) << 20)) {
                     sink.done();
                     return true;
                   }
                   return sink.write(piece.data(), piece.size());
                 },
                 "application/json");
        }
      });
    for (auto& t : th) t.join();
  };
  // One round first: the connection threads' stacks and the allocator's arenas exist from then on; the
  // test's own client buffers are freed too, and trimming makes RSS measure what the server keeps.
  suite(1);
  malloc_trim(0);
  const int64_t rss0 = test::rss_kb();
  const auto t0 = Clock::now();
  suite(2);
  malloc_trim(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int64_t rss1 = test::rss_kb();
  std::printf("malformed suite: %.1f s, RSS %lld -> %lld kB\n",
              std::chrono::duration<double>(Clock::now() - t0).count(), (long long)rss0, (long long)rss1);
  EXPECT_LT(double(rss1), 1.2 * double(rss0)) << "RSS grew from " << rss0 << " kB to " << rss1 << " kB";
  EXPECT_LT(health_seconds(), 1.0);
}

}  // namespace
#endif  // TREX_HAVE_HTTPLIB
