// A minimal OpenAI-compatible chat-completions client (vLLM, SGLang, hosted APIs) over cpp-httplib:
// POST {base_url}/chat/completions with the sampling settings; retries with exponential back-off on
// connection errors, time-outs, 408/409/429 and 5xx; other 4xx fail at once. Token usage is returned.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trex::orkit::eval {

struct ChatMessage {
  std::string role;  // system / user / assistant
  std::string content;
};

struct SamplingParams {
  double temperature = 0.6;  // T-Rex's settings
  double top_p = 1.0;
  int max_tokens = 9600;
  int seed = 42;
  nlohmann::json to_json() const;
};

struct ClientOptions {
  std::string base_url;  // http(s)://host[:port][/prefix], e.g. http://127.0.0.1:8000/v1
  std::string model;
  std::string api_key_env = "OPENAI_API_KEY";  // read from the environment; empty value: no Authorization
  int max_attempts = 4;
  double backoff_seconds = 1.0;  // 1, 2, 4, ... between attempts
  double timeout_seconds = 600.0;
};

struct ChatResult {
  bool ok = false;
  std::string content;               // choices[0]
  std::vector<std::string> choices;  // every choice's content, in index order (may be fewer than asked)
  std::string finish_reason;
  long prompt_tokens = 0, completion_tokens = 0;
  int attempts = 0;
  int http_status = 0;
  std::string error;  // when !ok
};

class OpenAIClient {
 public:
  explicit OpenAIClient(ClientOptions opts);
  // Thread-safe: each call opens its own connection. `n` > 1 asks for that many choices in one request
  // (the API's `n`); a server may return fewer (see generate.h for the fall-back).
  ChatResult chat(const std::vector<ChatMessage>& messages, const SamplingParams& sampling, int n = 1) const;
  const ClientOptions& options() const { return opts_; }

 private:
  ClientOptions opts_;
  std::string scheme_host_port_, path_prefix_, api_key_;
};

}  // namespace trex::orkit::eval
