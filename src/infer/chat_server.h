// OpenAI-compatible HTTP front end over the Scheduler (cpp-httplib; needs TREX_HAVE_HTTPLIB):
//   POST /v1/chat/completions, POST /v1/completions (stream: true -> server-sent events in the OpenAI chunk
//   formats), GET /v1/models, GET /health, GET /metrics (Prometheus text format).
// docs/serving.md lists every request field, the response formats and the limits; in short:
// - chat prompts use the DeepSeek-V4 chat encoding (design §6) with thinking on or off (`thinking: true` or
//   `chat_template_kwargs: {"thinking": true}`); in thinking mode the text before </think> is returned as
//   `reasoning_content`. Completions take `prompt` as a string, a list of ids, or a list of either (one
//   prompt each; choice index = prompt * n + j).
// - both: model (an unknown name is a 404), max_tokens (chat also max_completion_tokens), temperature,
//   top_p, seed (choice j of n samples with seed + j), n (the prompt is prefilled once and its caches
//   copied), stop (strings, matched across token boundaries, not returned), presence_penalty,
//   frequency_penalty, logprobs (chat: bool + top_logprobs; completions: an int), stream,
//   stream_options.include_usage. Extensions: `prompt_token_ids` (chat: replaces messages), `ignore_eos`,
//   choices carry `token_ids`.
// Errors: {"error": {"message", "type", "param", "code"}}: 400 bad request (code "context_length_exceeded"
// for prompts over the context limit), 404 unknown model or endpoint, 413 body too large, 503 queue full or
// too many connections. Messages are bounded and never echo the body.
// Limits (ServerLimits): body bytes however the body is sent (chunked included), open connections, header
// and body time-outs; each connection has its own thread, so idle or slow clients never delay /health.
// A streaming client that disconnects cancels its request (its slot is freed at the next step); a
// non-streaming request runs to its end.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"
#include "infer/scheduler.h"

namespace trex::infer {

struct ServerLimits {
  int64_t max_body_bytes = int64_t(16) << 20;  // request body, after any chunked framing
  int64_t max_connections = 256;               // open at once; more get a 503 and are closed
  double header_timeout_s = 10;  // from accept (or the previous response) to the end of the headers
  double body_timeout_s = 30;    // from the end of the headers to the end of the body
  int64_t max_prompts = 64;      // prompts in one /v1/completions request
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see ChatServer::bind)
  std::string model_name = "deepseek-v4";
  int64_t default_max_tokens = 256;  // when a request gives none (clamped to the context left)
  ServerLimits limits;
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
