#include "infer/chat_server.h"

#include "core/error.h"

#ifdef TREX_HAVE_HTTPLIB
#include <fmt/format.h>
#include <httplib.h>
#include <malloc.h>

#include <atomic>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "core/log.h"
#include "data/chat.h"
#include "infer/http_connections.h"
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

constexpr size_t kMaxMessageBytes = 400;        // error messages are cut here (they never quote the body)
constexpr size_t kBigBody = size_t(1) << 20;    // bodies above this parse one at a time, then memory is trimmed

constexpr int kMaxJsonDepth = 32;

// The offset where JSON text first nests deeper than max_depth arrays / objects (npos: never); brackets inside
// strings do not count.
size_t nesting_beyond(const std::string& s, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string::npos;
}

// A request error that becomes an OpenAI-style JSON error response.
struct HttpError {
  int status = 400;
  std::string message;
  std::string code;   // e.g. "context_length_exceeded" (empty -> null)
  std::string param;  // offending field (empty -> null)
};

std::string clip(std::string s) {
  if (s.size() > kMaxMessageBytes) {
    s.resize(utf8_complete_prefix(s.substr(0, kMaxMessageBytes)));
    s += "...";
  }
  return s;
}

json error_body(const HttpError& e) {
  const char* type = e.status == 503 ? "server_overloaded"
                     : e.status >= 500 ? "server_error"
                                       : "invalid_request_error";
  json err = {{"message", clip(e.message)}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.code.empty()) err["code"] = e.code;
  if (!e.param.empty()) err["param"] = e.param;
  return {{"error", err}};
}

[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "") {
  throw HttpError{400, msg, code, param};
}

bool present(const json& b, const char* k) {
  return b.contains(k) && !b[k].is_null();
}

double number_field(const json& b, const char* k, double dflt, double lo, double hi) {
  if (!present(b, k)) return dflt;
  if (!b[k].is_number()) bad(k, fmt::format("'{}' must be a number", k));
  const double v = b[k].get<double>();
  if (!(v >= lo && v <= hi)) bad(k, fmt::format("'{}' must be in [{}, {}]", k, lo, hi));
  return v;
}

// An integer in [lo, hi], checked before any narrowing (2^64 - 1 is not -1, 2^32 + 5 is not 5).
int64_t int_value(const json& v, const std::string& k, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(k, fmt::format("'{}' must be an integer in [{}, {}]", k, lo, hi));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
    bad(k, fmt::format("'{}' must be an integer in [{}, {}]", k, lo, hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(k, fmt::format("'{}' must be an integer in [{}, {}]", k, lo, hi));
  return x;
}

bool bool_field(const json& b, const char* k, bool dflt) {
  if (!present(b, k)) return dflt;
  if (!b[k].is_boolean()) bad(k, fmt::format("'{}' must be a boolean", k));
  return b[k].get<bool>();
}

std::vector<int32_t> id_list(const json& ids, const std::string& k, int64_t vocab) {
  if (!ids.is_array() || ids.empty()) bad(k, fmt::format("'{}' must be a non-empty list of token ids", k));
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const auto& v : ids) out.push_back(int32_t(int_value(v, k, 0, vocab - 1)));
  return out;
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

// What a request asks for besides its prompt (the same fields on both endpoints).
struct GenParams {
  bool chat = true;
  bool stream = false, include_usage = false;
  double temperature = 1.0, top_p = 1.0;
  double presence_penalty = 0, frequency_penalty = 0;
  uint64_t seed = 0;
  bool has_seed = false;
  int64_t max_tokens = -1;  // -1: server default
  int64_t n = 1;
  int32_t top_logprobs = -1;  // -1: no logprobs
  bool ignore_eos = false;    // extension (as vLLM): generate max_tokens tokens
  bool thinking = false;      // chat
  std::vector<std::string> stop;
};

GenParams parse_params(const json& b, bool chat, int64_t max_n) {
  GenParams p;
  p.chat = chat;
  p.stream = bool_field(b, "stream", false);
  p.ignore_eos = bool_field(b, "ignore_eos", false);
  if (present(b, "stream_options")) {
    if (!b["stream_options"].is_object()) bad("stream_options", "'stream_options' must be an object");
    p.include_usage = bool_field(b["stream_options"], "include_usage", false);
  }
  p.temperature = number_field(b, "temperature", 1.0, 0.0, 100.0);
  if (p.temperature != 0 && p.temperature < kMinTemperature)
    bad("temperature", fmt::format("'temperature' must be 0 (greedy) or in [{}, 100]", kMinTemperature));
  p.top_p = number_field(b, "top_p", 1.0, 0.0, 1.0);
  if (!(p.top_p > 0)) bad("top_p", "'top_p' must be in (0, 1]");
  p.presence_penalty = number_field(b, "presence_penalty", 0.0, -2.0, 2.0);
  p.frequency_penalty = number_field(b, "frequency_penalty", 0.0, -2.0, 2.0);
  if (present(b, "seed")) {
    const json& s = b["seed"];
    if (!s.is_number_integer()) bad("seed", "'seed' must be an integer");
    p.seed = s.is_number_unsigned() ? s.get<uint64_t>() : uint64_t(s.get<int64_t>());
    p.has_seed = true;
  }
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if ((chat || std::string(k) == "max_tokens") && present(b, k))
      p.max_tokens = int_value(b[k], k, 1, std::numeric_limits<int64_t>::max());
  if (present(b, "n")) p.n = int_value(b["n"], "n", 1, max_n);
  if (present(b, "best_of") && int_value(b["best_of"], "best_of", 1, max_n) != p.n)
    bad("best_of", "'best_of' other than n is not supported");
  if (chat) {
    const bool want = bool_field(b, "logprobs", false);
    if (present(b, "top_logprobs")) {
      if (!want) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      p.top_logprobs = int32_t(int_value(b["top_logprobs"], "top_logprobs", 0, kMaxTopLogprobs));
    } else if (want) {
      p.top_logprobs = 0;
    }
  } else if (present(b, "logprobs")) {
    p.top_logprobs = int32_t(int_value(b["logprobs"], "logprobs", 0, kMaxTopLogprobs));
  }
  if (present(b, "logit_bias") && !(b["logit_bias"].is_object() && b["logit_bias"].empty()))
    bad("logit_bias", "'logit_bias' is not supported");
  if (!chat) {
    if (bool_field(b, "echo", false)) bad("echo", "'echo' is not supported");
    if (present(b, "suffix")) bad("suffix", "'suffix' is not supported");
  }
  if (present(b, "stop")) {
    const json& s = b["stop"];
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) bad("stop", "at most 4 stop strings");
      for (const auto& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
    for (const auto& x : p.stop)
      if (x.size() > 256) bad("stop", "a stop string is longer than 256 bytes");
  }
  return p;
}

// Generated bytes need not be valid UTF-8 (a model can emit any byte sequence): replace, never throw.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

std::vector<int> byte_values(const std::string& s) {
  std::vector<int> b;
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// One choice of a response: its request, the text so far, and the logprob entries not yet sent.
struct Choice {
  int64_t index = 0;
  std::shared_ptr<Request> r;
  std::shared_ptr<TextStream> ts;
  std::vector<int32_t> ids;          // every generated token
  std::vector<TokenLogprob> lps;     // one per token when logprobs were asked for
  std::vector<int64_t> offset;       // per token: its byte offset in the content (-1: reasoning / </think>)
  int64_t content_bytes = 0;         // sum of the content tokens' bytes so far
  bool in_reasoning = false;
  size_t lp_sent = 0;                // logprob entries already returned
  size_t text_sent = 0;              // content bytes already returned
  bool done = false;
  int64_t prompt_tokens = 0;
};

}  // namespace

struct ChatServer::Impl {
  Scheduler& sched;
  const data::Tokenizer* tok;
  ServerOptions opts;
  ConnectionGuard guard;
  httplib::Server svr;
  std::mutex tok_mu;       // the tokenizer keeps a cache: one caller at a time
  std::mutex big_body_mu;  // large bodies parse one at a time (the JSON tree is ~10x the body)
  std::atomic<int64_t> next_id{1};
  std::mutex stat_mu;
  std::map<int, int64_t> http_status;  // responses by status code

  Impl(Scheduler& s, const data::Tokenizer* t, ServerOptions o)
      : sched(s),
        tok(t),
        opts(std::move(o)),
        guard(ConnectionLimits{opts.limits.max_connections, opts.limits.header_timeout_s,
                               opts.limits.body_timeout_s}) {}

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
  // The text of one token as logprobs show it (ids-only server: the id).
  std::string token_text(int32_t id) {
    if (!tok) return std::to_string(id);
    std::lock_guard<std::mutex> lk(tok_mu);
    return tok->decode({id});
  }

  int32_t end_think_id() {
    if (!tok) return -1;
    std::lock_guard<std::mutex> lk(tok_mu);
    return tok->token_to_id("</think>");
  }

  // ---- prompts ----
  std::vector<int32_t> chat_prompt(const json& b, bool thinking) {
    const int64_t V = sched.engine().config().vocab_size;
    if (present(b, "prompt_token_ids")) return id_list(b["prompt_token_ids"], "prompt_token_ids", V);
    if (!b.contains("messages")) bad("messages", "'messages' is required");
    const json msgs = normalise_messages(b["messages"]);
    if (!tok) bad("messages", "this server has no tokenizer: send 'prompt_token_ids' instead of 'messages'");
    try {
      const auto parsed = data::parse_messages(msgs, "request");
      std::lock_guard<std::mutex> lk(tok_mu);
      return data::encode_prompt(*tok, parsed, thinking);
    } catch (const trex::Error& e) {
      bad("messages", e.what());
    }
  }

  std::vector<int32_t> text_prompt(const std::string& text) {
    if (!tok) bad("prompt", "this server has no tokenizer: send the prompt as a list of token ids");
    std::vector<int32_t> ids;
    const int64_t bos = sched.engine().config().bos_token_id;
    if (bos >= 0) ids.push_back(int32_t(bos));  // as the tokenizer's post-processor would
    std::lock_guard<std::mutex> lk(tok_mu);
    tok->encode_append(text, ids, false);  // a prompt's text cannot smuggle in special tokens
    return ids;
  }

  // /v1/completions: a string, a list of ids, a list of strings, or a list of id lists.
  std::vector<std::vector<int32_t>> completion_prompts(const json& b) {
    if (!present(b, "prompt")) bad("prompt", "'prompt' is required");
    const json& p = b["prompt"];
    const int64_t V = sched.engine().config().vocab_size;
    std::vector<std::vector<int32_t>> out;
    if (p.is_string()) {
      out.push_back(text_prompt(p.get<std::string>()));
    } else if (p.is_array() && !p.empty() && p[0].is_number()) {
      out.push_back(id_list(p, "prompt", V));
    } else if (p.is_array() && !p.empty()) {
      if (int64_t(p.size()) > opts.limits.max_prompts)
        bad("prompt", fmt::format("at most {} prompts in one request", opts.limits.max_prompts));
      for (const auto& x : p) {
        if (x.is_string())
          out.push_back(text_prompt(x.get<std::string>()));
        else if (x.is_array())
          out.push_back(id_list(x, "prompt", V));
        else
          bad("prompt", "'prompt' must be a string, a list of token ids, or a list of either");
      }
    } else {
      bad("prompt", "'prompt' must be a string, a list of token ids, or a list of either");
    }
    return out;
  }

  RequestSpec build_spec(std::vector<int32_t> prompt, const GenParams& p, const char* prompt_param) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    const int64_t ctx = sched.engine().max_context(), n = int64_t(spec.prompt.size());
    if (n == 0) bad(prompt_param, "the prompt is empty");
    if (n >= ctx)
      bad(prompt_param,
          fmt::format(
              "the prompt has {} tokens; this model's context limit is {} tokens (prompt + completion)", n,
              ctx),
          "context_length_exceeded");
    if (p.max_tokens > 0) {
      if (p.max_tokens > ctx - n)  // a difference: max_tokens may be up to 2^63 - 1
        bad("max_tokens",
            fmt::format(
                "the prompt has {} tokens and max_tokens is {}: more than the context limit of {} tokens", n,
                p.max_tokens, ctx),
            "context_length_exceeded");
      spec.max_tokens = p.max_tokens;
    } else {
      spec.max_tokens = std::min(opts.default_max_tokens, ctx - n);
    }
    spec.sampling.temperature = p.temperature;
    spec.sampling.top_p = p.top_p;
    spec.sampling.seed = p.has_seed ? p.seed : std::random_device{}();
    spec.presence_penalty = p.presence_penalty;
    spec.frequency_penalty = p.frequency_penalty;
    spec.top_logprobs = p.top_logprobs;
    if (p.ignore_eos) return spec;
    spec.stop_ids.push_back(int32_t(sched.engine().config().eos_token_id));
    if (tok) {
      std::lock_guard<std::mutex> lk(tok_mu);
      const int32_t eos = tok->token_to_id("<\uff5cend\u2581of\u2581sentence\uff5c>");
      if (eos >= 0 && eos != spec.stop_ids[0]) spec.stop_ids.push_back(eos);
    }
    return spec;
  }

  // ---- choices ----
  void absorb(Choice& c, const std::vector<int32_t>& toks, const std::vector<TokenLogprob>& lps,
              int32_t end_think) {
    for (int32_t t : toks) {
      c.ids.push_back(t);
      if (c.in_reasoning) {
        c.offset.push_back(-1);
        if (t == end_think) c.in_reasoning = false;
      } else {
        // The ids-only server's text puts a space between ids: offsets count it.
        const int64_t sep = !tok && c.content_bytes > 0 ? 1 : 0;
        c.offset.push_back(c.content_bytes + sep);
        c.content_bytes += sep + int64_t(token_text(t).size());
      }
    }
    c.lps.insert(c.lps.end(), lps.begin(), lps.end());
  }

  // The logprob entries of tokens whose text starts before `limit` content bytes (reasoning tokens always),
  // from the first not yet sent; tokens of a matched stop string are never sent.
  std::vector<size_t> release(Choice& c, size_t limit) {
    std::vector<size_t> out;
    while (c.lp_sent < c.lps.size() && (c.offset[c.lp_sent] < 0 || size_t(c.offset[c.lp_sent]) < limit))
      out.push_back(c.lp_sent++);
    return out;
  }

  json chat_logprobs(Choice& c, const std::vector<size_t>& which) {
    json content = json::array();
    for (size_t i : which) {
      const std::string t = token_text(c.ids[i]);
      json top = json::array();
      for (const auto& [id, lp] : c.lps[i].top) {
        const std::string s = token_text(id);
        top.push_back({{"token", s}, {"logprob", lp}, {"bytes", byte_values(s)}});
      }
      content.push_back({{"token", t}, {"logprob", c.lps[i].logprob}, {"bytes", byte_values(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }

  json completion_logprobs(Choice& c, const std::vector<size_t>& which) {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    for (size_t i : which) {
      tokens.push_back(token_text(c.ids[i]));
      lps.push_back(c.lps[i].logprob);
      json top = json::object();
      for (const auto& [id, lp] : c.lps[i].top) {
        const std::string s = token_text(id);
        if (!top.contains(s)) top[s] = lp;  // two ids with one text: the likelier one
      }
      tops.push_back(top);
      offs.push_back(c.offset[i]);
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }

  json logprobs_json(Choice& c, const std::vector<size_t>& which, bool chat) {
    return chat ? chat_logprobs(c, which) : completion_logprobs(c, which);
  }

  static std::string finish_reason(const Choice& c) {
    return c.ts->stopped() ? "stop" : c.r->finish_reason();
  }
  static bool failed(const std::string& reason) { return reason == "error" || reason == "cancelled"; }

  json usage(const std::vector<Choice>& cs) const {
    int64_t prompt = 0, completion = 0;
    for (const auto& c : cs) {
      prompt += c.prompt_tokens;  // counted on the first choice of each prompt only
      completion += c.r->completion_tokens();
    }
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }

  // Reads the body through a byte counter: the limit holds for chunked bodies too (httplib checks only
  // Content-Length). Returns false after sending the error.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string& body) {
    const size_t limit = size_t(opts.limits.max_body_bytes);
    bool too_big = false;
    const bool ok = reader([&](const char* data, size_t n) {
      if (body.size() + n > limit) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    guard.body_read();
    if (ok && !too_big) return true;
    body.clear();
    body.shrink_to_fit();
    res.set_header("Connection", "close");  // the rest of the body is not read
    guard.close_after_response();
    if (too_big || res.status == 413)
      send_error(res, {413, fmt::format("the request body is larger than {} bytes", limit), "request_too_large", ""});
    else
      send_error(res, {400, "the request body could not be read", "", ""});
    (void)req;
    return false;
  }

  json parse_body(const std::string& body) {
    // A request is a few levels deep; "[[[[..." of megabytes would build millions of nested arrays.
    if (const size_t at = nesting_beyond(body, kMaxJsonDepth); at != std::string::npos)
      bad("", fmt::format("the request body nests JSON deeper than {} levels (at byte {})", kMaxJsonDepth, at));
    std::unique_lock<std::mutex> big(big_body_mu, std::defer_lock);
    if (body.size() > kBigBody) big.lock();
    try {
      return json::parse(body);
    } catch (const json::parse_error& e) {  // its message quotes the body: only the position is kept
      bad("", fmt::format("the request body is not valid JSON (error at byte {})", e.byte));
    } catch (const json::exception&) {
      bad("", "the request body is not valid JSON");
    }
  }

  void generate(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                bool chat) {
    std::string raw;
    if (!read_body(req, res, reader, raw)) return;
    struct Trim {  // large requests give their memory back to the system when they are done
      bool big;
      ~Trim() {
        if (big) malloc_trim(0);
      }
    } trim{raw.size() > kBigBody};
    GenParams p;
    std::vector<RequestSpec> specs;
    bool thinking = false;
    try {
      json b = parse_body(raw);
      raw.clear();
      raw.shrink_to_fit();
      if (!b.is_object()) bad("", "the request body must be a JSON object");
      if (present(b, "model")) {
        if (!b["model"].is_string()) bad("model", "'model' must be a string");
        if (b["model"].get<std::string>() != opts.model_name)
          throw HttpError{404,
                          fmt::format("the model '{}' does not exist (this server serves '{}')",
                                      clip(b["model"].get<std::string>()), opts.model_name),
                          "model_not_found", "model"};
      }
      p = parse_params(b, chat, sched.engine().slots());
      if (chat) {
        if (present(b, "thinking")) {
          const json& t = b["thinking"];
          if (t.is_boolean())
            thinking = t.get<bool>();
          else if (t.is_object() && t.contains("type") && t["type"].is_string())
            thinking = t["type"].get<std::string>() == "enabled";
          else
            bad("thinking", "'thinking' must be a boolean or {\"type\": \"enabled\"|\"disabled\"}");
        }
        if (present(b, "chat_template_kwargs")) {
          const json& k = b["chat_template_kwargs"];
          if (!k.is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
          for (const char* key : {"thinking", "enable_thinking"})
            if (k.contains(key)) {
              if (!k[key].is_boolean())
                bad("chat_template_kwargs", fmt::format("chat_template_kwargs.{} must be a boolean", key));
              thinking = k[key].get<bool>();
            }
        }
        p.thinking = thinking;
        specs.push_back(build_spec(chat_prompt(b, thinking), p,
                                   present(b, "prompt_token_ids") ? "prompt_token_ids" : "messages"));
      } else {
        for (auto& ids : completion_prompts(b)) specs.push_back(build_spec(std::move(ids), p, "prompt"));
      }
    } catch (const HttpError& e) {
      send_error(res, e);
      return;
    } catch (const json::exception& e) {  // a field of the wrong JSON type
      send_error(res, {400, fmt::format("invalid request: {}", e.what()), "", ""});
      return;
    }
    std::vector<Choice> choices;
    const int32_t end_think = chat && thinking ? end_think_id() : -1;
    try {
      for (auto& spec : specs) {
        const int64_t n_prompt = int64_t(spec.prompt.size());
        auto group = sched.submit_group(std::move(spec), p.n);
        for (size_t j = 0; j < group.size(); ++j) {
          Choice c;
          c.index = int64_t(choices.size());
          c.r = group[j];
          c.ts = std::make_shared<TextStream>([this](const std::vector<int32_t>& ids) { return decode(ids); },
                                              p.stop, end_think);
          c.in_reasoning = end_think >= 0;
          c.prompt_tokens = j == 0 ? n_prompt : 0;
          choices.push_back(std::move(c));
        }
      }
    } catch (const trex::Error& e) {
      for (auto& c : choices) c.r->cancel();
      const std::string msg = e.what();
      send_error(res, {msg.find("queue is full") != std::string::npos ? 503 : 400, msg, "", ""});
      return;
    }
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id++);
    const int64_t created = int64_t(std::time(nullptr));
    if (!p.stream) {
      respond(res, choices, p, id, created, end_think);
      return;
    }
    count(200);
    res.set_header("Cache-Control", "no-cache");
    auto state = std::make_shared<std::vector<Choice>>(std::move(choices));
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, state, p, id, created, end_think](size_t, httplib::DataSink& sink) {
          try {
            return stream_events(sink, *state, p, id, created, end_think);
          } catch (const std::exception& e) {  // never let an exception escape into the HTTP thread
            log::warn("stream {}: {}", id, e.what());
            for (auto& c : *state) c.r->cancel();
            return false;
          }
        },
        [state](bool) {  // released: make sure nothing keeps generating for nobody
          for (auto& c : *state) c.r->cancel();
        });
  }

  void respond(httplib::Response& res, std::vector<Choice>& choices, const GenParams& p, const std::string& id,
               int64_t created, int32_t end_think) {
    std::vector<int32_t> toks;
    std::vector<TokenLogprob> lps;
    for (auto& c : choices) {
      while (!c.done) {
        toks.clear();
        lps.clear();
        c.done = c.r->wait(toks, std::chrono::milliseconds(1000), &lps);
        absorb(c, toks, lps, end_think);
        c.ts->push(toks);
        if (c.ts->stopped()) c.r->cancel();
      }
      c.ts->finish();
    }
    json out_choices = json::array();
    for (auto& c : choices) {
      const std::string reason = finish_reason(c);
      if (failed(reason)) {
        send_error(res, {500, fmt::format("generation failed: {}", c.r->error().empty() ? reason : c.r->error()),
                         "", ""});
        return;
      }
      json lp = nullptr;
      if (p.top_logprobs >= 0) lp = logprobs_json(c, release(c, c.ts->content().size()), p.chat);
      json ch = {{"index", c.index}, {"logprobs", lp}, {"finish_reason", reason}, {"token_ids", c.ids}};
      if (p.chat) {
        json msg = {{"role", "assistant"}, {"content", c.ts->content()}};
        if (p.thinking) msg["reasoning_content"] = c.ts->reasoning();
        ch["message"] = msg;
      } else {
        ch["text"] = c.ts->content();
      }
      out_choices.push_back(ch);
    }
    json out = {{"id", id},
                {"object", p.chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", opts.model_name},
                {"choices", out_choices},
                {"usage", usage(choices)}};
    res.set_content(dump(out), "application/json");
    count(200);
  }

  bool stream_events(httplib::DataSink& sink, std::vector<Choice>& choices, const GenParams& p,
                     const std::string& id, int64_t created, int32_t end_think) {
    const char* object = p.chat ? "chat.completion.chunk" : "text_completion";
    auto chunk = [&](const json& choice) {
      return sse({{"id", id},
                  {"object", object},
                  {"created", created},
                  {"model", opts.model_name},
                  {"choices", json::array({choice})}});
    };
    auto write = [&](const std::string& s) {
      if (sink.write(s.data(), s.size())) return true;
      for (auto& c : choices) c.r->cancel();  // the client is gone: free the slots
      return false;
    };
    // One chunk per delta of one choice; logprobs ride with the text they belong to.
    auto send = [&](Choice& c, const TextDelta& d, const json& reason) {
      c.text_sent += d.content.size();
      const bool final = !reason.is_null();
      json lp = nullptr;
      if (p.top_logprobs >= 0) {
        const auto which = release(c, final ? c.ts->content().size() : c.text_sent);
        if (!which.empty() || final) lp = logprobs_json(c, which, p.chat);
      }
      if (d.empty() && lp.is_null() && !final) return true;
      json ch = {{"index", c.index}, {"logprobs", lp}, {"finish_reason", reason}};
      if (p.chat) {
        json delta = json::object();
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        if (!d.content.empty()) delta["content"] = d.content;
        ch["delta"] = delta;
      } else {
        ch["text"] = d.content;
      }
      return write(chunk(ch));
    };
    if (p.chat)
      for (auto& c : choices)
        if (!write(chunk({{"index", c.index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                          {"logprobs", nullptr}, {"finish_reason", nullptr}})))
          return false;
    std::vector<int32_t> toks;
    std::vector<TokenLogprob> lps;
    auto last_write = std::chrono::steady_clock::now();
    for (;;) {
      bool waited = false, all_done = true, wrote = false;
      for (auto& c : choices) {
        if (c.done) continue;
        all_done = false;
        toks.clear();
        lps.clear();
        // Block (briefly) on the first running choice only; poll the others.
        c.done = c.r->wait(toks, std::chrono::milliseconds(waited ? 0 : 100), &lps);
        waited = true;
        absorb(c, toks, lps, end_think);
        TextDelta d = c.ts->push(toks);
        if (c.ts->stopped()) c.r->cancel();
        if (!d.empty()) {
          if (!send(c, d, nullptr)) return false;
          wrote = true;
        }
        if (!c.done) continue;
        const TextDelta rest = c.ts->finish();
        if (!rest.empty() && !send(c, rest, nullptr)) return false;
        const std::string reason = finish_reason(c);
        if (failed(reason)) {
          HttpError e{500, fmt::format("generation failed: {}", c.r->error().empty() ? reason : c.r->error()), "",
                      ""};
          write(sse(error_body(e)));
          for (auto& o : choices) o.r->cancel();
          return false;
        }
        if (!send(c, {}, reason)) return false;
        wrote = true;
      }
      if (all_done) break;
      if (wrote) {
        last_write = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last_write > std::chrono::seconds(1)) {
        // A comment line keeps proxies from timing out and reveals a closed connection.
        if (!write(": keep-alive\n\n")) return false;
        last_write = std::chrono::steady_clock::now();
      }
    }
    if (p.include_usage &&
        !write(sse({{"id", id},
                    {"object", object},
                    {"created", created},
                    {"model", opts.model_name},
                    {"choices", json::array()},
                    {"usage", usage(choices)}})))
      return false;
    if (!write("data: [DONE]\n\n")) return false;
    sink.done();
    return true;
  }

  std::string metrics_text() {
    const SchedulerMetrics m = sched.metrics();
    std::string s;
    auto metric = [&](const char* name, const char* type, const char* help, const std::string& samples) {
      s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", name, help, name, type, samples);
    };
    metric("trex_requests_total", "counter", "Generation requests (one per choice) by outcome.",
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
    metric("trex_http_responses_total", "counter", "Generation HTTP responses by status code.", http);
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
    const ConnectionStats cs = guard.stats();
    metric("trex_open_connections", "gauge", "HTTP connections open now.",
           fmt::format("trex_open_connections {}\n", cs.open));
    metric("trex_connections_total", "counter", "HTTP connections by outcome.",
           fmt::format("trex_connections_total{{outcome=\"accepted\"}} {}\n"
                       "trex_connections_total{{outcome=\"refused\"}} {}\n"
                       "trex_connections_total{{outcome=\"timed_out\"}} {}\n",
                       cs.accepted, cs.refused, cs.timed_out));
    return s;
  }

  void routes() {
    svr.Post("/v1/chat/completions",
             [this](const httplib::Request& q, httplib::Response& s, const httplib::ContentReader& r) {
               generate(q, s, r, true);
             });
    svr.Post("/v1/completions",
             [this](const httplib::Request& q, httplib::Response& s, const httplib::ContentReader& r) {
               generate(q, s, r, false);
             });
    // Every other path with a body: read it under the same limit (httplib would buffer a chunked body of
    // any size for a path it has no handler for), then 404.
    auto other = [this](const httplib::Request& q, httplib::Response& s, const httplib::ContentReader& r) {
      std::string body;
      if (!read_body(q, s, r, body)) return;
      send_error(s, {404, "no such endpoint", "", ""});
    };
    svr.Post(".*", other);
    svr.Put(".*", other);
    svr.Patch(".*", other);
    svr.Delete(".*", other);
    svr.set_pre_routing_handler([this](const httplib::Request& q, httplib::Response&) {
      guard.headers_read();
      if (q.method == "GET" || q.method == "HEAD" || q.method == "OPTIONS") guard.body_read();  // no body
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_logger([this](const httplib::Request&, const httplib::Response&) { guard.response_written(); });
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
  const ServerLimits& l = impl_->opts.limits;
  TREX_CHECK(l.max_body_bytes >= 1024, "trex serve: the body limit must be at least 1024 bytes, got {}",
             l.max_body_bytes);
  TREX_CHECK(l.max_connections >= 1, "trex serve: max connections must be >= 1, got {}", l.max_connections);
  TREX_CHECK(l.header_timeout_s > 0 && l.body_timeout_s > 0, "trex serve: time-outs must be > 0 s");
  // Memory given back after large requests: glibc raises its mmap threshold after the first large free (up to
  // 32 MiB), after which multi-MB bodies and JSON arrays live in per-thread arenas whose freed tops malloc_trim
  // does not return (RSS stayed ~7x up after a suite of malformed 6-20 MB requests). A fixed threshold keeps
  // every allocation of 1 MiB or more an mmap that free() unmaps; fewer arenas bound what small ones keep.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_ARENA_MAX, 4);
  impl_->svr.new_task_queue = [this] { return impl_->guard.new_task_queue(); };
  impl_->svr.set_payload_max_length(size_t(l.max_body_bytes));  // Content-Length: refused before reading
  // Per read() / write(); the guard bounds a request's headers and body as a whole.
  const auto per_read = std::chrono::duration<double>(std::min(l.header_timeout_s, l.body_timeout_s));
  impl_->svr.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(per_read));
  impl_->svr.set_write_timeout(30, 0);
  impl_->svr.set_keep_alive_timeout(5);
  impl_->svr.set_keep_alive_max_count(100);
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
    impl_->guard.set_port(p);
    return p;
  }
  TREX_CHECK(impl_->svr.bind_to_port(o.host, o.port),
             "trex serve: cannot bind {}:{} (in use, or no permission?)", o.host, o.port);
  impl_->guard.set_port(o.port);
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
