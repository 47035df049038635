// A `trex serve` server in process on the tiny fixture model with a small BPE tokenizer trained here (the
// server tests' shared setup), plus small HTTP helpers.
#pragma once
#ifdef TREX_HAVE_HTTPLIB
#include <httplib.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/bpe_trainer.h"
#include "infer/chat_server.h"
#include "infer/engine.h"
#include "infer_test_util.h"

namespace trex::test {

struct TinyServer {
  static constexpr int64_t kSlots = 8, kContext = 1024;
  std::unique_ptr<data::Tokenizer> tok;
  std::shared_ptr<dsv4::Model<float>> model;
  std::unique_ptr<infer::Scheduler> sched;
  std::unique_ptr<infer::ChatServer> server;
  std::thread thread;
  int port = 0;

  explicit TinyServer(infer::ServerLimits limits = {}) {
    data::BpeTrainOptions bo;
    bo.vocab_size = 320;  // = the tiny model's vocabulary: 6 specials + 256 bytes + 58 merges
    data::BpeTrainer trainer(bo);
    for (int i = 0; i < 50; ++i)
      trainer.add_text(
          "minimise the total cost subject to the capacity of each warehouse and the demand of "
          "each customer; the optimal solution is the one with the lowest objective value. ");
    tok = std::make_unique<data::Tokenizer>(trainer.train());
    model = infer::load_inference_model(dsv4_fixture("tiny"));
    sched = std::make_unique<infer::Scheduler>(infer::make_cpu_engine(model, kSlots, kContext));
    infer::ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    o.default_max_tokens = 8;
    o.limits = limits;
    server = std::make_unique<infer::ChatServer>(*sched, tok.get(), o);
    port = server->bind();
    thread = std::thread([this] { server->run(); });
    httplib::Client c("127.0.0.1", port);
    for (int i = 0; i < 100 && !c.Get("/health"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ~TinyServer() {
    server->stop();
    thread.join();
  }

  httplib::Result post(const std::string& path, const nlohmann::json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c.Post(path, body.dump(), "application/json");
  }
};

inline int64_t rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// The JSON of every "data:" line of an SSE body before [DONE]; done_seen tells whether it ended.
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done_seen) {
  std::vector<nlohmann::json> ev;
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
    ev.push_back(nlohmann::json::parse(payload));
  }
  return ev;
}

}  // namespace trex::test
#endif
