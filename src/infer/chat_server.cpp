#include "infer/chat_server.h"

#include "core/error.h"

#ifdef TREX_HAVE_HTTPLIB
#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "core/log.h"
#include "data/chat.h"
#include "infer/text_stream.h"
#endif

namespace trex::infer {

#ifndef TREX_HAVE_HTTPLIB

bool http_server_available() {
  return false;
}
struct ChatServer::Impl {};
ChatServer::ChatServer(Scheduler&, const data::Tokenizer*, ServerOptions) {
  fail("trex serve: this build has no HTTP server (cpp-httplib was not found at configure time)");
}
ChatServer::~ChatServer() = default;
int ChatServer::bind() {
  return -1;
}
void ChatServer::run() {}
void ChatServer::stop() {}

#else

bool http_server_available() {
  return true;
}

using json = nlohmann::json;

namespace {

// A request error that becomes an OpenAI-style JSON error response.
struct HttpError {
  int status = 400;
  std::string message;
  std::string code;   // e.g. "context_length_exceeded" (empty -> null)
  std::string param;  // offending field (empty -> null)
};

json error_body(const HttpError& e) {
  const char* type = e.status == 400   ? "invalid_request_error"
                     : e.status == 503 ? "server_overloaded"
                                       : "server_error";
  json err = {{"message", e.message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.code.empty()) err["code"] = e.code;
  if (!e.param.empty()) err["param"] = e.param;
  return {{"error", err}};
}

[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "") {
  throw HttpError{400, msg, code, param};
}

// What a chat request asks for, before tokenisation.
struct ChatRequest {
  json messages;                    // null when prompt_token_ids is used
  std::vector<int32_t> prompt_ids;  // extension
  bool thinking = false;
  bool stream = false, include_usage = false;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  bool has_seed = false;
  int64_t max_tokens = -1;  // -1: server default
  bool ignore_eos = false;  // extension (as vLLM): generate max_tokens tokens
  std::vector<std::string> stop;
};

double number_field(const json& b, const char* k, double dflt) {
  if (!b.contains(k) || b[k].is_null()) return dflt;
  if (!b[k].is_number()) bad(k, fmt::format("'{}' must be a number", k));
  return b[k].get<double>();
}

bool bool_field(const json& b, const char* k, bool dflt) {
  if (!b.contains(k) || b[k].is_null()) return dflt;
  if (!b[k].is_boolean()) bad(k, fmt::format("'{}' must be a boolean", k));
  return b[k].get<bool>();
}

// OpenAI content may be a list of parts; only text parts are supported.
json normalise_messages(const json& msgs) {
  if (!msgs.is_array()) bad("messages", "'messages' must be a list");
  if (msgs.empty()) bad("messages", "'messages' must not be empty");
  json out = json::array();
  for (size_t i = 0; i < msgs.size(); ++i) {
    json m = msgs[i];
    if (m.is_object() && m.contains("content") && m["content"].is_array()) {
      std::string text;
      for (const auto& part : m["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad("messages", fmt::format("messages[{}].content: only parts of type 'text' are supported", i));
        text += part["text"].get<std::string>();
      }
      m["content"] = text;
    }
    out.push_back(std::move(m));
  }
  return out;
}

ChatRequest parse_chat_request(const json& b) {
  if (!b.is_object()) bad("", "the request body must be a JSON object");
  ChatRequest r;
  if (b.contains("prompt_token_ids") && !b["prompt_token_ids"].is_null()) {
    const json& ids = b["prompt_token_ids"];
    if (!ids.is_array() || ids.empty())
      bad("prompt_token_ids", "'prompt_token_ids' must be a non-empty list");
    for (const auto& v : ids) {
      if (!v.is_number_integer()) bad("prompt_token_ids", "'prompt_token_ids' must hold integers");
      r.prompt_ids.push_back(v.get<int32_t>());
    }
  } else {
    if (!b.contains("messages")) bad("messages", "'messages' is required");
    r.messages = normalise_messages(b["messages"]);
  }
  if (b.contains("thinking") && !b["thinking"].is_null()) {
    const json& t = b["thinking"];
    if (t.is_boolean())
      r.thinking = t.get<bool>();
    else if (t.is_object() && t.contains("type") && t["type"].is_string())
      r.thinking = t["type"].get<std::string>() == "enabled";
    else
      bad("thinking", "'thinking' must be a boolean or {\"type\": \"enabled\"|\"disabled\"}");
  }
  if (b.contains("chat_template_kwargs") && b["chat_template_kwargs"].is_object()) {
    const json& k = b["chat_template_kwargs"];
    for (const char* key : {"thinking", "enable_thinking"})
      if (k.contains(key)) {
        if (!k[key].is_boolean())
          bad("chat_template_kwargs", fmt::format("chat_template_kwargs.{} must be a boolean", key));
        r.thinking = k[key].get<bool>();
      }
  }
  r.stream = bool_field(b, "stream", false);
  r.ignore_eos = bool_field(b, "ignore_eos", false);
  if (b.contains("stream_options") && b["stream_options"].is_object())
    r.include_usage = bool_field(b["stream_options"], "include_usage", false);
  r.temperature = number_field(b, "temperature", 1.0);
  if (r.temperature < 0 || r.temperature > 100) bad("temperature", "'temperature' must be in [0, 100]");
  r.top_p = number_field(b, "top_p", 1.0);
  if (!(r.top_p > 0 && r.top_p <= 1)) bad("top_p", "'top_p' must be in (0, 1]");
  if (b.contains("seed") && !b["seed"].is_null()) {
    if (!b["seed"].is_number_integer()) bad("seed", "'seed' must be an integer");
    r.seed = b["seed"].is_number_unsigned() ? b["seed"].get<uint64_t>() : uint64_t(b["seed"].get<int64_t>());
    r.has_seed = true;
  }
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (b.contains(k) && !b[k].is_null()) {
      if (!b[k].is_number_integer() || b[k].get<int64_t>() < 1)
        bad(k, fmt::format("'{}' must be an integer >= 1", k));
      r.max_tokens = b[k].get<int64_t>();
    }
  if (b.contains("n") && !b["n"].is_null() && !(b["n"].is_number_integer() && b["n"].get<int64_t>() == 1))
    bad("n", "only n = 1 is supported");
  if (b.contains("stop") && !b["stop"].is_null()) {
    const json& s = b["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) bad("stop", "at most 4 stop strings");
      for (const auto& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
  }
  return r;
}

// Generated bytes need not be valid UTF-8 (a model can emit any byte sequence): replace, never throw.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

}  // namespace

struct ChatServer::Impl {
  Scheduler& sched;
  const data::Tokenizer* tok;
  ServerOptions opts;
  httplib::Server svr;
  std::mutex tok_mu;  // the tokenizer keeps a cache: one caller at a time
  std::atomic<int64_t> next_id{1};
  std::mutex stat_mu;
  std::map<int, int64_t> http_status;  // responses by status code

  Impl(Scheduler& s, const data::Tokenizer* t, ServerOptions o) : sched(s), tok(t), opts(std::move(o)) {}

  void count(int status) {
    std::lock_guard<std::mutex> lk(stat_mu);
    ++http_status[status];
  }
  void send_error(httplib::Response& res, const HttpError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
    count(e.status);
  }

  std::string decode(const std::vector<int32_t>& ids) {
    if (!tok) {  // ids-only server: space-separated ids
      std::string s;
      for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
      return s;
    }
    std::lock_guard<std::mutex> lk(tok_mu);
    return tok->decode(ids);
  }

  int32_t end_think_id() {
    if (!tok) return -1;
    std::lock_guard<std::mutex> lk(tok_mu);
    return tok->token_to_id("</think>");
  }

  RequestSpec build_spec(const ChatRequest& r) {
    RequestSpec spec;
    if (!r.prompt_ids.empty()) {
      spec.prompt = r.prompt_ids;
    } else {
      if (!tok)
        bad("messages", "this server has no tokenizer: send 'prompt_token_ids' instead of 'messages'");
      try {
        const auto msgs = data::parse_messages(r.messages, "request");
        std::lock_guard<std::mutex> lk(tok_mu);
        spec.prompt = data::encode_prompt(*tok, msgs, r.thinking);
      } catch (const trex::Error& e) {
        bad("messages", e.what());
      }
    }
    const int64_t ctx = sched.engine().max_context(), n = int64_t(spec.prompt.size());
    if (n >= ctx)
      bad("messages",
          fmt::format(
              "the prompt has {} tokens; this model's context limit is {} tokens (prompt + completion)", n,
              ctx),
          "context_length_exceeded");
    if (r.max_tokens > 0) {
      if (n + r.max_tokens > ctx)
        bad("max_tokens",
            fmt::format(
                "the prompt has {} tokens and max_tokens is {}: more than the context limit of {} tokens", n,
                r.max_tokens, ctx),
            "context_length_exceeded");
      spec.max_tokens = r.max_tokens;
    } else {
      spec.max_tokens = std::min(opts.default_max_tokens, ctx - n);
    }
    spec.sampling.temperature = r.temperature;
    spec.sampling.top_p = r.top_p;
    spec.sampling.seed = r.has_seed ? r.seed : std::random_device{}();
    if (r.ignore_eos) return spec;
    spec.stop_ids.push_back(int32_t(sched.engine().config().eos_token_id));
    if (tok) {
      std::lock_guard<std::mutex> lk(tok_mu);
      const int32_t eos = tok->token_to_id("<\uff5cend\u2581of\u2581sentence\uff5c>");
      if (eos >= 0 && eos != spec.stop_ids[0]) spec.stop_ids.push_back(eos);
    }
    return spec;
  }

  json usage(const Request& r) const {
    return {{"prompt_tokens", r.prompt_tokens()},
            {"completion_tokens", r.completion_tokens()},
            {"total_tokens", r.prompt_tokens() + r.completion_tokens()}};
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    ChatRequest cr;
    RequestSpec spec;
    try {
      json body;
      try {
        body = json::parse(req.body);
      } catch (const json::exception& e) {
        bad("", fmt::format("the request body is not valid JSON: {}", e.what()));
      }
      cr = parse_chat_request(body);
      spec = build_spec(cr);
    } catch (const HttpError& e) {
      send_error(res, e);
      return;
    } catch (const json::exception& e) {  // a field of the wrong JSON type
      send_error(res, {400, fmt::format("invalid request: {}", e.what()), "", ""});
      return;
    }
    std::shared_ptr<Request> r;
    try {
      r = sched.submit(spec);
    } catch (const trex::Error& e) {
      const std::string msg = e.what();
      send_error(res, {msg.find("queue is full") != std::string::npos ? 503 : 400, msg, "", ""});
      return;
    }
    const std::string id = fmt::format("chatcmpl-{}", next_id++);
    const int64_t created = int64_t(std::time(nullptr));
    const int32_t end_think = cr.thinking ? end_think_id() : -1;
    auto ts = std::make_shared<TextStream>([this](const std::vector<int32_t>& ids) { return decode(ids); },
                                           cr.stop, end_think);
    auto all_ids = std::make_shared<std::vector<int32_t> >();
    auto finish_reason = [r, ts]() -> std::string {
      if (ts->stopped()) return "stop";
      return r->finish_reason();
    };

    if (!cr.stream) {
      std::vector<int32_t> toks;
      bool done = false;
      while (!done) {
        toks.clear();
        done = r->wait(toks, std::chrono::milliseconds(1000));
        all_ids->insert(all_ids->end(), toks.begin(), toks.end());
        ts->push(toks);
        if (ts->stopped()) r->cancel();
      }
      ts->finish();
      const std::string reason = finish_reason();
      if (reason == "error" || reason == "cancelled") {
        send_error(res, {500, fmt::format("generation failed: {}", r->error().empty() ? reason : r->error()),
                         "", ""});
        return;
      }
      json msg = {{"role", "assistant"}, {"content", ts->content()}};
      if (cr.thinking) msg["reasoning_content"] = ts->reasoning();
      json out = {
          {"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", opts.model_name},
          {"choices",
           json::array(
               {{{"index", 0}, {"message", msg}, {"finish_reason", reason}, {"token_ids", *all_ids}}})},
          {"usage", usage(*r)}};
      res.set_content(dump(out), "application/json");
      count(200);
      return;
    }

    count(200);
    const bool include_usage = cr.include_usage;
    const bool thinking = cr.thinking;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, r, ts, id, created, include_usage, thinking, finish_reason](size_t, httplib::DataSink& sink) {
          try {
            return stream_events(sink, *r, *ts, id, created, include_usage, finish_reason);
          } catch (const std::exception& e) {  // never let an exception escape into the HTTP thread
            log::warn("chat stream {}: {}", id, e.what());
            r->cancel();
            return false;
          }
          (void)thinking;
        },
        [r](bool) { r->cancel(); });  // released: make sure nothing keeps generating for nobody
  }

  bool stream_events(httplib::DataSink& sink, Request& req, TextStream& text, const std::string& id,
                     int64_t created, bool include_usage, const std::function<std::string()>& finish_reason) {
    Request* r = &req;
    TextStream* ts = &text;
    {
      {
        auto chunk = [&](const json& delta, const json& reason) {
          return sse(
              {{"id", id},
               {"object", "chat.completion.chunk"},
               {"created", created},
               {"model", opts.model_name},
               {"choices", json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", reason}}})}});
        };
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          r->cancel();  // the client is gone: free the slot
          return false;
        };
        if (!write(chunk({{"role", "assistant"}, {"content", ""}}, nullptr))) return false;
        auto send_delta = [&](const TextDelta& d) {
          if (!d.reasoning.empty() && !write(chunk({{"reasoning_content", d.reasoning}}, nullptr)))
            return false;
          if (!d.content.empty() && !write(chunk({{"content", d.content}}, nullptr))) return false;
          return true;
        };
        std::vector<int32_t> toks;
        auto last_write = std::chrono::steady_clock::now();
        bool done = false;
        while (!done) {
          toks.clear();
          done = r->wait(toks, std::chrono::milliseconds(250));
          const TextDelta d = ts->push(toks);
          if (ts->stopped()) r->cancel();
          if (!d.empty()) {
            if (!send_delta(d)) return false;
            last_write = std::chrono::steady_clock::now();
          } else if (std::chrono::steady_clock::now() - last_write > std::chrono::seconds(1)) {
            // A comment line keeps proxies from timing out and reveals a closed connection.
            if (!write(": keep-alive\n\n")) return false;
            last_write = std::chrono::steady_clock::now();
          }
        }
        if (!send_delta(ts->finish())) return false;
        const std::string reason = finish_reason();
        if (reason == "error" || reason == "cancelled") {
          HttpError e{500, fmt::format("generation failed: {}", r->error().empty() ? reason : r->error()), "",
                      ""};
          if (!write(sse(error_body(e)))) return false;
        } else {
          if (!write(chunk(json::object(), reason))) return false;
        }
        if (include_usage) {
          json u = {{"id", id},
                    {"object", "chat.completion.chunk"},
                    {"created", created},
                    {"model", opts.model_name},
                    {"choices", json::array()},
                    {"usage", usage(*r)}};
          if (!write(sse(u))) return false;
        }
        if (!write("data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      }
    }
  }

  std::string metrics_text() {
    const SchedulerMetrics m = sched.metrics();
    std::string s;
    auto metric = [&](const char* name, const char* type, const char* help, const std::string& samples) {
      s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, samples);
    };
    metric("trex_requests_total", "counter", "Chat completion requests by outcome.",
           fmt::format("trex_requests_total{{outcome=\"submitted\"}} {}\n"
                       "trex_requests_total{{outcome=\"finished\"}} {}\n"
                       "trex_requests_total{{outcome=\"cancelled\"}} {}\n"
                       "trex_requests_total{{outcome=\"failed\"}} {}\n"
                       "trex_requests_total{{outcome=\"rejected\"}} {}\n",
                       m.requests_submitted, m.requests_finished, m.requests_cancelled, m.requests_failed,
                       m.requests_rejected));
    std::string http;
    {
      std::lock_guard<std::mutex> lk(stat_mu);
      for (const auto& [code, n] : http_status)
        http += fmt::format("trex_http_responses_total{{code=\"{}\"}} {}\n", code, n);
    }
    metric("trex_http_responses_total", "counter", "Chat completion HTTP responses by status code.", http);
    metric("trex_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
           fmt::format("trex_prompt_tokens_total {}\n", m.prompt_tokens));
    metric("trex_completion_tokens_total", "counter", "Tokens generated.",
           fmt::format("trex_completion_tokens_total {}\n", m.completion_tokens));
    metric("trex_engine_steps_total", "counter", "Batched engine steps.",
           fmt::format("trex_engine_steps_total {}\n", m.steps));
    metric("trex_engine_step_seconds_total", "counter", "Seconds spent in engine steps.",
           fmt::format("trex_engine_step_seconds_total {:.6f}\n", m.step_seconds));
    metric("trex_active_slots", "gauge", "Sequences being generated now.",
           fmt::format("trex_active_slots {}\n", m.active));
    metric("trex_slots", "gauge", "Sequence slots of the engine (max batch).",
           fmt::format("trex_slots {}\n", sched.engine().slots()));
    metric("trex_queued_requests", "gauge", "Requests waiting for a slot.",
           fmt::format("trex_queued_requests {}\n", m.queued));
    metric("trex_cache_bytes", "gauge", "Bytes held by the sequence caches.",
           fmt::format("trex_cache_bytes {}\n", m.cache_bytes));
    return s;
  }

  void routes() {
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { chat(q, s); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) {
      json j = {{"object", "list"},
                {"data", json::array({{{"id", opts.model_name},
                                       {"object", "model"},
                                       {"created", 0},
                                       {"owned_by", "trex"},
                                       {"max_model_len", sched.engine().max_context()}}})}};
      s.set_content(dump(j), "application/json");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& s) {
      const SchedulerMetrics m = sched.metrics();
      json j = {
          {"status", "ok"}, {"engine", sched.engine().name()}, {"active", m.active}, {"queued", m.queued}};
      s.set_content(dump(j), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      s.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    svr.set_error_handler([](const httplib::Request&, httplib::Response& s) {
      if (!s.body.empty()) return;
      HttpError e{s.status, s.status == 404 ? "no such endpoint" : fmt::format("HTTP error {}", s.status), "",
                  ""};
      s.set_content(dump(error_body(e)), "application/json");
    });
  }
};

ChatServer::ChatServer(Scheduler& scheduler, const data::Tokenizer* tokenizer, ServerOptions opts)
    : impl_(std::make_unique<Impl>(scheduler, tokenizer, std::move(opts))) {
  const int threads = impl_->opts.threads > 0 ? impl_->opts.threads : int(2 * scheduler.engine().slots() + 8);
  impl_->svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  impl_->svr.set_payload_max_length(size_t(16) << 20);
  impl_->svr.set_read_timeout(30, 0);
  impl_->svr.set_write_timeout(30, 0);
  impl_->routes();
}

ChatServer::~ChatServer() {
  stop();
}

int ChatServer::bind() {
  const auto& o = impl_->opts;
  if (o.port == 0) {
    const int p = impl_->svr.bind_to_any_port(o.host);
    TREX_CHECK(p > 0, "trex serve: cannot bind {} on any port", o.host);
    return p;
  }
  TREX_CHECK(impl_->svr.bind_to_port(o.host, o.port),
             "trex serve: cannot bind {}:{} (in use, or no permission?)", o.host, o.port);
  return o.port;
}

void ChatServer::run() {
  impl_->svr.listen_after_bind();
}

void ChatServer::stop() {
  if (impl_) impl_->svr.stop();
}

#endif

}  // namespace trex::infer
