#include "orkit/eval/generate.h"

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.h"
#include "core/progress.h"

namespace trex::orkit::eval {

using nlohmann::json;

std::map<std::string, std::string> generate_responses(const Benchmark& bench, const OpenAIClient& client,
                                                      ResponseCache& cache, const GenerateOptions& opts,
                                                      bool progress, GenerationStats& stats) {
  std::vector<const BenchItem*> todo;
  for (const auto& it : bench.items)
    if (it.has_ground_truth()) todo.push_back(&it);
  std::map<std::string, std::string> out;
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::optional<ProgressBar> bar;
  if (progress) bar.emplace("generate " + bench.name, int64_t(todo.size()), "req");
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
      const BenchItem& item = *todo[i];
      const PromptFormat pf = prompt_format_for(opts.prompt_format, item);
      const auto messages = build_prompt(pf, item);
      json jm = json::array();
      for (const auto& m : messages) jm.push_back({{"role", m.role}, {"content", m.content}});
      const std::string key = ResponseCache::key(item.id, opts.client.model, jm, opts.sampling.to_json());
      std::optional<std::string> response;
      if (auto hit = cache.get(key)) {
        response = (*hit)["response"].get<std::string>();
        std::lock_guard<std::mutex> lock(mu);
        ++stats.cached;
      } else {
        const ChatResult r = client.chat(messages, opts.sampling);
        std::lock_guard<std::mutex> lock(mu);
        ++stats.requests;
        stats.prompt_tokens += r.prompt_tokens;
        stats.completion_tokens += r.completion_tokens;
        if (r.ok) {
          response = r.content;
          cache.put(key, {{"id", item.id},
                          {"benchmark", bench.name},
                          {"prompt", prompt_format_name(pf)},
                          {"response", r.content},
                          {"finish_reason", r.finish_reason},
                          {"usage",
                           {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens}}},
                          {"attempts", r.attempts}});
        } else {
          ++stats.failed;
          log::warn("{}: request failed after {} attempt(s): {}", item.id, r.attempts, r.error);
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      if (response) out[item.id] = *response;
      if (bar) bar->advance(1, fmt::format("failed {}", stats.failed));
    }
  };
  const int n = std::max(1, std::min<int>(opts.concurrency, int(todo.size())));
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (bar) bar->finish();
  return out;
}

}  // namespace trex::orkit::eval
