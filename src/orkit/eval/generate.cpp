#include "orkit/eval/generate.h"

#include <atomic>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace trex::orkit::eval {

using nlohmann::json;

std::map<std::string, std::vector<std::string>> generate_samples(const Benchmark& bench, const OpenAIClient& client,
                                                                 ResponseCache& cache, const GenerateOptions& opts,
                                                                 bool progress, GenerationStats& stats) {
  TREX_CHECK(opts.samples >= 1, "samples per item must be at least 1, got {}", opts.samples);
  std::vector<const BenchItem*> todo;
  for (const auto& it : bench.items)
    if (it.has_ground_truth()) todo.push_back(&it);
  const std::string base_dir = !opts.data_base_dir.empty() ? opts.data_base_dir
                               : bench.path.empty()        ? std::string()
                                                           : std::filesystem::absolute(bench.path).parent_path().string();
  const int n = opts.samples;
  std::map<std::string, std::vector<std::string>> out;
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::optional<ProgressBar> bar;
  if (progress) bar.emplace("generate " + bench.name, int64_t(todo.size()), "item");
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
      const BenchItem& item = *todo[i];
      const PromptFormat pf = prompt_format_for(opts.prompt_format, item);
      const auto messages = build_prompt(pf, item, opts.protocol, base_dir);
      json jm = json::array();
      for (const auto& m : messages) jm.push_back({{"role", m.role}, {"content", m.content}});
      auto key_of = [&](int s) {
        return ResponseCache::key(s == 0 ? item.id : item.id + "#sample" + std::to_string(s), opts.client.model, jm,
                                  opts.sampling.to_json());
      };
      std::vector<std::optional<std::string>> got(static_cast<size_t>(n));
      std::vector<int> missing;
      for (int s = 0; s < n; ++s) {
        if (auto hit = cache.get(key_of(s))) {
          got[size_t(s)] = (*hit)["response"].get<std::string>();
          std::lock_guard<std::mutex> lock(mu);
          ++stats.cached;
        } else {
          missing.push_back(s);
        }
      }
      auto store = [&](int s, const ChatResult& r, const std::string& text) {
        got[size_t(s)] = text;
        cache.put(key_of(s), {{"id", item.id},
                              {"sample", s},
                              {"benchmark", bench.name},
                              {"prompt", prompt_format_name(pf)},
                              {"protocol", protocol_name(opts.protocol)},
                              {"response", text},
                              {"finish_reason", r.finish_reason},
                              {"usage", {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens}}},
                              {"attempts", r.attempts}});
      };
      auto account = [&](const ChatResult& r) {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.requests;
        stats.prompt_tokens += r.prompt_tokens;
        stats.completion_tokens += r.completion_tokens;
        if (!r.ok) {
          ++stats.failed;
          log::warn("{}: request failed after {} attempt(s): {}", item.id, r.attempts, r.error);
        }
      };
      size_t served = 0;  // missing samples filled by the one `n` request
      if (missing.size() > 1) {
        SamplingParams sp = opts.sampling;
        const ChatResult r = client.chat(messages, sp, int(missing.size()));
        account(r);
        if (r.ok)
          for (; served < missing.size() && served < r.choices.size(); ++served)
            store(missing[served], r, r.choices[served]);
      }
      for (size_t m = served; m < missing.size(); ++m) {  // one at a time, each with its own seed
        const int s = missing[m];
        SamplingParams sp = opts.sampling;
        sp.seed = opts.sampling.seed + s;
        const ChatResult r = client.chat(messages, sp, 1);
        account(r);
        if (r.ok) store(s, r, r.content);
      }
      std::lock_guard<std::mutex> lock(mu);
      std::vector<std::string> answers;
      for (auto& g : got)
        if (g) answers.push_back(std::move(*g));
      if (!answers.empty()) out[item.id] = std::move(answers);
      if (bar) bar->advance(1, fmt::format("failed {}", stats.failed));
    }
  };
  const int threads = std::max(1, std::min<int>(opts.concurrency, int(todo.size())));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (bar) bar->finish();
  return out;
}

std::map<std::string, std::string> generate_responses(const Benchmark& bench, const OpenAIClient& client,
                                                      ResponseCache& cache, const GenerateOptions& opts,
                                                      bool progress, GenerationStats& stats) {
  GenerateOptions one = opts;
  one.samples = 1;
  std::map<std::string, std::string> out;
  for (auto& [id, v] : generate_samples(bench, client, cache, one, progress, stats)) out[id] = std::move(v.front());
  return out;
}

}  // namespace trex::orkit::eval
