#include "infer/scheduler.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "infer/speculative.h"

namespace trex::infer {

TokenLogprob token_logprob(const float* logits, int64_t n, int32_t token, int32_t k) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  TokenLogprob lp;
  lp.logprob = float(double(logits[token]) - lse);
  const int64_t kk = std::min<int64_t>(std::max<int32_t>(k, 0), n);
  if (kk > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t j = 0; j < kk; ++j) lp.top.emplace_back(ids[size_t(j)], float(double(logits[ids[size_t(j)]]) - lse));
  }
  return lp;
}

// ------------------------------------------------------------------------------------------------
// Request
// ------------------------------------------------------------------------------------------------
bool Request::wait(std::vector<int32_t>& out, std::chrono::milliseconds timeout,
                   std::vector<TokenLogprob>* logprobs) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return finished_ || handed_out_ < tokens_.size(); });
  out.insert(out.end(), tokens_.begin() + ptrdiff_t(handed_out_), tokens_.end());
  if (logprobs && logprobs_.size() == tokens_.size())
    logprobs->insert(logprobs->end(), logprobs_.begin() + ptrdiff_t(handed_out_), logprobs_.end());
  handed_out_ = tokens_.size();
  return finished_;
}

int64_t Request::completion_tokens() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int64_t(tokens_.size());
}

void Request::publish(int32_t token, TokenLogprob lp) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    tokens_.push_back(token);
    if (spec_.top_logprobs >= 0) logprobs_.push_back(std::move(lp));
  }
  cv_.notify_all();
}

void Request::finish(const std::string& reason, const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;
    finished_ = true;
    finish_reason_ = reason;
    error_ = error;
  }
  cv_.notify_all();
}

int32_t Request::pick(const float* logits, int64_t n) {
  if (spec_.presence_penalty == 0 && spec_.frequency_penalty == 0) return sampler_.sample(logits, n);
  scratch_.assign(logits, logits + n);
  if (generated_count_.size() != size_t(n)) generated_count_.assign(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i)
    if (const int32_t c = generated_count_[size_t(i)])
      scratch_[size_t(i)] -= float(spec_.frequency_penalty * c + spec_.presence_penalty);
  return sampler_.sample(scratch_.data(), n);
}

// ------------------------------------------------------------------------------------------------
// Scheduler
// ------------------------------------------------------------------------------------------------
Scheduler::Scheduler(std::unique_ptr<Engine> engine, SchedulerOptions opts)
    : engine_(std::move(engine)), opts_(opts) {
  TREX_CHECK(engine_ != nullptr, "scheduler: no engine");
  TREX_CHECK(opts_.prefill_chunk >= 1, "scheduler: prefill_chunk must be >= 1");
  TREX_CHECK(opts_.step_prompt_tokens >= 0, "scheduler: step_prompt_tokens must be >= 0 (0: no bound), got {}",
             opts_.step_prompt_tokens);
  slots_.resize(size_t(engine_->slots()));
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& g : queue_)
    for (auto& r : g) r->finish("cancelled", "server shutting down");
  for (auto& r : slots_)
    if (r) r->finish("cancelled", "server shutting down");
  queue_.clear();
  queued_requests_ = 0;
}

void Scheduler::check(const RequestSpec& spec) const {
  TREX_CHECK(!spec.prompt.empty(), "the prompt is empty");
  TREX_CHECK(spec.max_tokens >= 1, "max_tokens must be >= 1, got {}", spec.max_tokens);
  const int64_t ctx = engine_->max_context(), n = int64_t(spec.prompt.size());
  // Written as a difference: max_tokens may be anything up to 2^63 - 1.
  TREX_CHECK(
      n <= ctx && spec.max_tokens <= ctx - n,
      "the prompt has {} tokens and max_tokens is {}: together more than the context limit of {} tokens", n,
      spec.max_tokens, ctx);
  const int64_t V = engine_->config().vocab_size;
  for (size_t i = 0; i < spec.prompt.size(); ++i)
    TREX_CHECK(spec.prompt[i] >= 0 && spec.prompt[i] < V, "prompt token {} at index {} is outside [0, {})",
               spec.prompt[i], i, V);
  validate(spec.sampling);
  for (const auto& [name, v] : {std::pair<const char*, double>{"presence_penalty", spec.presence_penalty},
                                {"frequency_penalty", spec.frequency_penalty}})
    TREX_CHECK(std::isfinite(v) && v >= -2.0 && v <= 2.0, "{} must be in [-2, 2], got {}", name, v);
  TREX_CHECK(spec.top_logprobs >= -1 && spec.top_logprobs <= kMaxTopLogprobs,
             "top_logprobs must be in [0, {}], got {}", kMaxTopLogprobs, spec.top_logprobs);
}

std::shared_ptr<Request> Scheduler::submit(RequestSpec spec) {
  return submit_group(std::move(spec), 1)[0];
}

std::vector<std::shared_ptr<Request>> Scheduler::submit_group(RequestSpec spec, int64_t n) {
  check(spec);
  TREX_CHECK(n >= 1 && n <= engine_->slots(), "n must be in [1, {}] (the engine's slots), got {}",
             engine_->slots(), n);
  std::vector<std::shared_ptr<Request>> group;
  for (int64_t i = 0; i < n; ++i) {
    RequestSpec s = spec;
    s.sampling.seed = spec.sampling.seed + uint64_t(i);
    group.push_back(std::shared_ptr<Request>(new Request(std::move(s))));
    group.back()->timeline_.submitted = std::chrono::steady_clock::now();
    if (i > 0) group.back()->leader_ = group[0];
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    TREX_CHECK(!stopping_, "the server is shutting down");
    if (queued_requests_ + n > opts_.max_queue) {
      ++m_.requests_rejected;
      fail("the request queue is full ({} waiting); retry later", queued_requests_);
    }
    queue_.push_back(group);
    queued_requests_ += n;
    m_.requests_submitted += n;
  }
  cv_.notify_all();
  return group;
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  SchedulerMetrics m = m_;
  m.queued = queued_requests_;
  m.active = int64_t(std::count_if(slots_.begin(), slots_.end(), [](const auto& r) { return r != nullptr; }));
  return m;
}

void Scheduler::loop() {
  std::vector<std::shared_ptr<Request>> active;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto has_work = [&] {
        if (stopping_) return true;
        for (const auto& r : slots_)
          if (r) return true;
        return !queue_.empty();
      };
      cv_.wait(lk, has_work);
      if (stopping_) return;
      // Free the slots of cancelled requests (and of followers whose leader left before the prompt was
      // prefilled: nothing would ever fill their caches), then admit queued groups into free slots.
      for (size_t s = 0; s < slots_.size(); ++s) {
        Request* r = slots_[s].get();
        if (!r) continue;
        const bool orphan = r->leader_ && !r->forked_ && r->leader_->slot_ < 0;
        if (r->cancelled() || orphan) {
          r->finish("cancelled");
          ++m_.requests_cancelled;
          r->slot_ = -1;
          slots_[s].reset();
        }
      }
      int64_t free_slots = std::count_if(slots_.begin(), slots_.end(), [](const auto& r) { return !r; });
      std::vector<Request*> admitted;
      while (!queue_.empty()) {
        auto& g = queue_.front();
        if (std::all_of(g.begin(), g.end(), [](const auto& r) { return r->cancelled(); })) {
          for (auto& r : g) r->finish("cancelled");  // gone before it started
          m_.requests_cancelled += int64_t(g.size());
          queued_requests_ -= int64_t(g.size());
          queue_.pop_front();
          continue;
        }
        if (int64_t(g.size()) > free_slots) break;  // groups start whole, in order
        for (auto& r : g) {
          size_t s = 0;
          while (slots_[s]) ++s;
          r->slot_ = int64_t(s);
          engine_->reset(int64_t(s));
          slots_[s] = r;
          admitted.push_back(r.get());
        }
        free_slots -= int64_t(g.size());
        queued_requests_ -= int64_t(g.size());
        queue_.pop_front();
      }
      const auto now = std::chrono::steady_clock::now();
      for (Request* r : admitted) r->timeline_.admitted = now, r->timeline_.admitted_with = int64_t(admitted.size());
      active.clear();
      for (const auto& r : slots_)
        if (r) active.push_back(r);
    }
    if (!active.empty()) step_once(active);
  }
}

void Scheduler::step_once(std::vector<std::shared_ptr<Request>>& active) {
  // Followers wait (no feed) until their leader's prompt is in, and so does a prompt beyond the step's prompt
  // token budget (the first prompt always gets at least one token, so every step makes progress); every other
  // request gets a feed.
  std::vector<EngineFeed> feeds;
  std::vector<int64_t> feed_of(active.size(), -1);
  int64_t prompt_budget =
      opts_.step_prompt_tokens > 0 ? opts_.step_prompt_tokens : std::numeric_limits<int64_t>::max();
  for (size_t k = 0; k < active.size(); ++k) {
    Request& r = *active[k];
    if (r.leader_ && !r.forked_) continue;
    const int64_t n = int64_t(r.spec_.prompt.size());
    if (r.fed_ < n) {
      if (prompt_budget <= 0) continue;
      const int64_t c = std::min({opts_.prefill_chunk, n - r.fed_, prompt_budget});
      prompt_budget -= c;
      feed_of[k] = int64_t(feeds.size());
      feeds.push_back({r.slot_, r.spec_.prompt.data() + r.fed_, c});
    } else {
      feed_of[k] = int64_t(feeds.size());
      feeds.push_back({r.slot_, &r.last_, 1});
    }
  }
  // All-greedy steps let the engine pick the tokens (on the device for the CUDA engine: no logits copy).
  bool greedy = true;
  for (const auto& r : active) greedy = greedy && !r->needs_logits();
  std::vector<float> logits;
  std::vector<int32_t> picked;
  // Speculative decoding (speculative.h): an all-greedy step on an engine with MTP drafts may return a second
  // token per feed (its accepted draft's successor).
  SpeculativeEngine* spec = speculative_engine(*engine_);
  if (spec && !spec->speculating()) spec = nullptr;
  std::vector<std::vector<int32_t>> multi;
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    if (feeds.empty()) {
    } else if (greedy && spec) {
      std::vector<char> decoding(feeds.size(), 0);  // a decode feed (the request's last token), not a prompt chunk
      for (size_t k = 0; k < active.size(); ++k)
        if (feed_of[k] >= 0) decoding[size_t(feed_of[k])] = feeds[size_t(feed_of[k])].ids == &active[k]->last_;
      spec->forward_greedy_speculative(feeds, decoding, multi);
      for (const auto& v : multi) picked.push_back(v.front());
    } else if (greedy) {
      engine_->forward_greedy(feeds, picked);
    } else {
      engine_->forward(feeds, logits);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(t1 - t0).count();
  int64_t step_tokens = 0;
  for (const EngineFeed& f : feeds) step_tokens += f.n;
  for (size_t k = 0; k < active.size(); ++k) {  // the TTFT timeline of requests still before their first token
    RequestTimeline& tl = active[k]->timeline_;
    if (feed_of[k] < 0 || tl.first_token != RequestTimeline::Time{}) continue;
    if (tl.steps_to_first_token++ == 0) tl.first_step = t0;
  }
  const int64_t V = engine_->config().vocab_size;
  // Decide every outcome first; publish only after the bookkeeping, so that a client that sees its request
  // finish also sees it counted and its slot free.
  struct Outcome {
    int32_t token = -1;  // to publish (-1: none)
    int32_t token2 = -1;  // a speculative step's second token, after `token` (-1: none)
    TokenLogprob lp;
    std::string finish;  // empty: keeps running
  };
  std::vector<Outcome> out(active.size());
  std::vector<bool> prompt_done(active.size(), false);  // this step fed the last prompt chunk
  int64_t new_prompt = 0, new_completion = 0, failed = 0, finished = 0;
  // Token t of request k goes into `into` (the step's token, or a speculative step's second one) under the stop
  // and length rules; lg is its logits row when the request needs logits (logprobs, penalties), else null.
  auto append = [&](size_t k, int32_t t, const float* lg, int32_t& into) {
    Request& r = *active[k];
    const auto& stop = r.spec_.stop_ids;
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) {
      out[k].finish = "stop";
    } else {
      r.last_ = t;
      ++r.produced_;
      ++new_completion;
      into = t;
      if (r.spec_.top_logprobs >= 0) out[k].lp = token_logprob(lg, V, t, r.spec_.top_logprobs);
      if (r.spec_.presence_penalty != 0 || r.spec_.frequency_penalty != 0) {
        if (r.generated_count_.size() != size_t(V)) r.generated_count_.assign(size_t(V), 0);
        ++r.generated_count_[size_t(t)];
      }
      if (r.produced_ >= r.spec_.max_tokens) out[k].finish = "length";
    }
    if (!out[k].finish.empty()) ++finished;
  };
  auto emit = [&](size_t k, int64_t row) {
    const float* lg = greedy ? nullptr : logits.data() + row * V;
    append(k, greedy ? picked[size_t(row)] : active[k]->pick(lg, V), lg, out[k].token);
  };
  for (size_t k = 0; k < active.size(); ++k) {
    Request& r = *active[k];
    if (feed_of[k] < 0) continue;  // a follower: below, with its leader
    if (!error.empty()) {
      out[k].finish = "error";
      ++failed;
      continue;
    }
    const int64_t n = int64_t(r.spec_.prompt.size());
    if (r.fed_ < n) {
      r.fed_ += feeds[size_t(feed_of[k])].n;
      new_prompt += feeds[size_t(feed_of[k])].n;
      if (r.fed_ < n) continue;  // more prompt chunks to go
      prompt_done[k] = true;
    }
    emit(k, feed_of[k]);
    // The second token of an accepted draft: the same stop / length rules, after the first.
    const int64_t row = feed_of[k];
    if (greedy && spec && multi[size_t(row)].size() == 2 && out[k].finish.empty() && out[k].token >= 0)
      append(k, multi[size_t(row)][1], nullptr, out[k].token2);
  }
  // Followers of a leader whose prompt just went in: fork its caches, then sample from its prompt logits.
  for (size_t k = 0; k < active.size(); ++k) {
    Request& r = *active[k];
    if (feed_of[k] >= 0) continue;
    size_t lk = 0;
    while (lk < active.size() && active[lk].get() != r.leader_.get()) ++lk;
    if (lk == active.size()) continue;  // leader not in a slot: freed as an orphan at the next admission
    if (!error.empty()) {
      out[k].finish = "error";
      ++failed;
      continue;
    }
    if (!prompt_done[lk]) continue;
    try {
      engine_->copy_slot(r.leader_->slot_, r.slot_);
    } catch (const std::exception& e) {
      out[k].finish = "error";
      ++failed;
      log::warn("copying the prompt's caches for n > 1 failed: {}", e.what());
      continue;
    }
    r.forked_ = true;
    r.fed_ = r.leader_->fed_;
    emit(k, feed_of[lk]);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t k = 0; k < active.size(); ++k)
      if (!out[k].finish.empty()) {
        slots_[size_t(active[k]->slot_)].reset();
        active[k]->slot_ = -1;
      }
    m_.steps += 1;
    m_.step_seconds += dt;
    m_.prompt_tokens += new_prompt;
    m_.completion_tokens += new_completion;
    m_.requests_finished += finished;
    m_.requests_failed += failed;
    m_.cache_bytes = engine_->cache_bytes();
  }
  const auto published = std::chrono::steady_clock::now();
  for (size_t k = 0; k < active.size(); ++k) {
    RequestTimeline& tl = active[k]->timeline_;
    if (out[k].token >= 0 && tl.first_token == RequestTimeline::Time{}) {
      if (tl.steps_to_first_token == 0) tl.first_step = t0, tl.steps_to_first_token = 1;  // a forked follower
      tl.prompt_done = t1, tl.first_token = published, tl.first_token_step_tokens = step_tokens;
    }
    if (out[k].token >= 0) active[k]->publish(out[k].token, std::move(out[k].lp));
    if (out[k].token2 >= 0) active[k]->publish(out[k].token2, TokenLogprob{});
    if (!out[k].finish.empty()) active[k]->finish(out[k].finish, out[k].finish == "error" ? error : "");
  }
  if (!error.empty()) log::warn("engine step failed: {}", error);
}

}  // namespace trex::infer
