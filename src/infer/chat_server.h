// OpenAI-compatible HTTP front end over the Scheduler (cpp-httplib; needs TREX_HAVE_HTTPLIB):
//   POST /v1/chat/completions  (stream: true -> server-sent events in the OpenAI chunk format)
//   GET  /v1/models, GET /health, GET /metrics (Prometheus text format)
// Prompts use the DeepSeek-V4 chat encoding (design §6) with thinking on or off (`thinking: true` or
// `chat_template_kwargs: {"thinking": true}`); in thinking mode the text before </think> is returned as
// `reasoning_content`. Sampling: temperature (default 1), top_p (default 1), seed, max_tokens
// (or max_completion_tokens), stop (string or list). Extension: `prompt_token_ids` (list of ints) replaces
// `messages` (the only way to prompt a server without a tokenizer); `ignore_eos: true` generates max_tokens
// tokens (as vLLM); choices carry `token_ids`.
// Errors: HTTP 400 with {"error": {"message", "type": "invalid_request_error", "param", "code"}} for bad
// requests (code "context_length_exceeded" for prompts over the context limit), 503 when the queue is full.
// A streaming client that disconnects cancels its request (its slot is freed at the next step); a
// non-streaming request runs to its end.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "infer/scheduler.h"

namespace trex::infer {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see ChatServer::bind)
  std::string model_name = "deepseek-v4";
  int64_t default_max_tokens = 256;  // when a request gives none (clamped to the context left)
  int threads = 0;                   // HTTP worker threads; 0: 2 * slots + 8
};

class ChatServer {
 public:
  // `tokenizer` may be null (ids-only server). Both must outlive the server.
  ChatServer(Scheduler& scheduler, const data::Tokenizer* tokenizer, ServerOptions opts);
  ~ChatServer();
  int bind();  // binds host:port, returns the port; throws trex::Error when it cannot
  void run();  // serves until stop(); bind() first
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

bool http_server_available();  // false when built without cpp-httplib

}  // namespace trex::infer
