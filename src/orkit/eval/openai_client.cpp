#include "orkit/eval/openai_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/error.h"
#ifdef TREX_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace trex::orkit::eval {

using nlohmann::json;

json SamplingParams::to_json() const {
  return json{{"temperature", temperature}, {"top_p", top_p}, {"max_tokens", max_tokens}, {"seed", seed}};
}

OpenAIClient::OpenAIClient(ClientOptions opts) : opts_(std::move(opts)) {
  const std::string& u = opts_.base_url;
  const size_t scheme_end = u.find("://");
  TREX_CHECK(scheme_end != std::string::npos && (u.rfind("http://", 0) == 0 || u.rfind("https://", 0) == 0),
             "--base-url must start with http:// or https://, got \"{}\"", u);
  const size_t path_start = u.find('/', scheme_end + 3);
  scheme_host_port_ = u.substr(0, path_start);
  path_prefix_ = path_start == std::string::npos ? "" : u.substr(path_start);
  while (!path_prefix_.empty() && path_prefix_.back() == '/') path_prefix_.pop_back();
  TREX_CHECK(!opts_.model.empty(), "a model name is needed (--model)");
  TREX_CHECK(opts_.max_attempts >= 1, "--retries must be at least 1");
  if (!opts_.api_key_env.empty())
    if (const char* k = std::getenv(opts_.api_key_env.c_str())) api_key_ = k;
}

ChatResult OpenAIClient::chat(const std::vector<ChatMessage>& messages,
                              const SamplingParams& sampling, int n) const {
  ChatResult res;
#ifndef TREX_HAVE_HTTPLIB
  res.error = "built without cpp-httplib (TREX_HAVE_HTTPLIB): no HTTP client";
  return res;
#else
  json body{{"model", opts_.model}, {"messages", json::array()}, {"n", std::max(1, n)}};
  for (const auto& m : messages) body["messages"].push_back({{"role", m.role}, {"content", m.content}});
  const json sampling_json = sampling.to_json();  // items() must not iterate a temporary
  for (const auto& [k, v] : sampling_json.items()) body[k] = v;
  const std::string payload = body.dump(-1, ' ', false, json::error_handler_t::replace);
  httplib::Headers headers;
  if (!api_key_.empty()) headers.emplace("Authorization", "Bearer " + api_key_);
  const std::string path = path_prefix_ + "/chat/completions";
  for (int attempt = 1; attempt <= opts_.max_attempts; ++attempt) {
    res.attempts = attempt;
    httplib::Client cli(scheme_host_port_);
    const auto secs = std::chrono::duration<double>(opts_.timeout_seconds);
    cli.set_connection_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(std::min(secs, decltype(secs)(30.0))));
    cli.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
    cli.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(secs));
    auto r = cli.Post(path, headers, payload, "application/json");
    bool retryable = true;
    if (!r) {
      res.error =
          fmt::format("request to {}{} failed: {}", scheme_host_port_, path, httplib::to_string(r.error()));
    } else {
      res.http_status = r->status;
      if (r->status == 200) {
        try {
          const json j = json::parse(r->body);
          const json& choices = j.at("choices");
          TREX_CHECK(choices.is_array() && !choices.empty(), "no choices");
          std::vector<std::pair<long, std::string>> indexed;
          for (size_t c = 0; c < choices.size(); ++c) {
            const json& content = choices[c].at("message").at("content");
            const json idx = choices[c].value("index", json(long(c)));
            indexed.emplace_back(idx.is_number_integer() ? idx.get<long>() : long(c),
                                 content.is_string() ? content.get<std::string>() : "");
          }
          std::stable_sort(indexed.begin(), indexed.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
          res.choices.clear();
          for (auto& [idx, text] : indexed) res.choices.push_back(std::move(text));
          if (int(res.choices.size()) > std::max(1, n)) res.choices.resize(size_t(std::max(1, n)));
          res.content = res.choices.front();
          const json& choice = choices.at(0);
          res.finish_reason = choice.value("finish_reason", json("")).is_string()
                                  ? choice.value("finish_reason", std::string())
                                  : "";
          if (j.contains("usage") && j["usage"].is_object()) {
            res.prompt_tokens = j["usage"].value("prompt_tokens", 0L);
            res.completion_tokens = j["usage"].value("completion_tokens", 0L);
          }
          res.ok = true;
          res.error.clear();
          return res;
        } catch (const std::exception& e) {
          res.error = fmt::format("malformed response from {}: {}", path, e.what());
          retryable = true;
        }
      } else {
        res.error =
            fmt::format("HTTP {} from {}{}: {}", r->status, scheme_host_port_, path, r->body.substr(0, 500));
        retryable = r->status == 408 || r->status == 409 || r->status == 429 || r->status >= 500;
      }
    }
    if (!retryable || attempt == opts_.max_attempts) break;
    const double wait = opts_.backoff_seconds * double(1 << (attempt - 1));
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  return res;
#endif
}

}  // namespace trex::orkit::eval
