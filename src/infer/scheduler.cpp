#include "infer/scheduler.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "infer/speculative.h"

namespace trex::infer {

// ------------------------------------------------------------------------------------------------
// Request
// ------------------------------------------------------------------------------------------------
bool Request::wait(std::vector<int32_t>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return finished_ || handed_out_ < tokens_.size(); });
  out.insert(out.end(), tokens_.begin() + ptrdiff_t(handed_out_), tokens_.end());
  handed_out_ = tokens_.size();
  return finished_;
}

int64_t Request::completion_tokens() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int64_t(tokens_.size());
}

void Request::publish(int32_t token) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    tokens_.push_back(token);
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

// ------------------------------------------------------------------------------------------------
// Scheduler
// ------------------------------------------------------------------------------------------------
Scheduler::Scheduler(std::unique_ptr<Engine> engine, SchedulerOptions opts)
    : engine_(std::move(engine)), opts_(opts) {
  TREX_CHECK(engine_ != nullptr, "scheduler: no engine");
  TREX_CHECK(opts_.prefill_chunk >= 1, "scheduler: prefill_chunk must be >= 1");
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
  for (auto& r : queue_) r->finish("cancelled", "server shutting down");
  for (auto& r : slots_)
    if (r) r->finish("cancelled", "server shutting down");
  queue_.clear();
}

std::shared_ptr<Request> Scheduler::submit(RequestSpec spec) {
  TREX_CHECK(!spec.prompt.empty(), "the prompt is empty");
  TREX_CHECK(spec.max_tokens >= 1, "max_tokens must be >= 1, got {}", spec.max_tokens);
  const int64_t ctx = engine_->max_context(), n = int64_t(spec.prompt.size());
  TREX_CHECK(
      n + spec.max_tokens <= ctx,
      "the prompt has {} tokens and max_tokens is {}: together more than the context limit of {} tokens", n,
      spec.max_tokens, ctx);
  const int64_t V = engine_->config().vocab_size;
  for (size_t i = 0; i < spec.prompt.size(); ++i)
    TREX_CHECK(spec.prompt[i] >= 0 && spec.prompt[i] < V, "prompt token {} at index {} is outside [0, {})",
               spec.prompt[i], i, V);
  validate(spec.sampling);
  auto r = std::shared_ptr<Request>(new Request(std::move(spec)));
  {
    std::lock_guard<std::mutex> lk(mu_);
    TREX_CHECK(!stopping_, "the server is shutting down");
    if (int64_t(queue_.size()) >= opts_.max_queue) {
      ++m_.requests_rejected;
      fail("the request queue is full ({} waiting); retry later", queue_.size());
    }
    queue_.push_back(r);
    ++m_.requests_submitted;
  }
  cv_.notify_all();
  return r;
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  SchedulerMetrics m = m_;
  m.queued = int64_t(queue_.size());
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
      // Free the slots of cancelled requests, then admit queued ones into free slots.
      for (size_t s = 0; s < slots_.size(); ++s)
        if (slots_[s] && slots_[s]->cancelled()) {
          slots_[s]->finish("cancelled");
          ++m_.requests_cancelled;
          slots_[s].reset();
        }
      for (size_t s = 0; s < slots_.size(); ++s) {
        if (slots_[s]) continue;
        while (!queue_.empty() && queue_.front()->cancelled()) {  // gone before it started
          queue_.front()->finish("cancelled");
          ++m_.requests_cancelled;
          queue_.pop_front();
        }
        if (queue_.empty()) break;
        auto r = queue_.front();
        queue_.pop_front();
        r->slot_ = int64_t(s);
        engine_->reset(int64_t(s));
        slots_[s] = r;
      }
      active.clear();
      for (const auto& r : slots_)
        if (r) active.push_back(r);
    }
    if (!active.empty()) step_once(active);
  }
}

void Scheduler::step_once(std::vector<std::shared_ptr<Request>>& active) {
  std::vector<EngineFeed> feeds;
  for (const auto& r : active) {
    const int64_t n = int64_t(r->spec_.prompt.size());
    if (r->fed_ < n) {
      const int64_t k = std::min(opts_.prefill_chunk, n - r->fed_);
      feeds.push_back({r->slot_, r->spec_.prompt.data() + r->fed_, k});
    } else {
      feeds.push_back({r->slot_, &r->last_, 1});
    }
  }
  // All-greedy steps let the engine pick the tokens (on the device for the CUDA engine: no logits copy).
  bool greedy = true;
  for (const auto& r : active) greedy = greedy && r->spec_.sampling.temperature == 0.0;
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
    if (greedy && spec) {
      std::vector<char> decoding;  // a decode feed (the request's last token), not a prompt chunk
      for (size_t k = 0; k < feeds.size(); ++k) decoding.push_back(feeds[k].ids == &active[k]->last_);
      spec->forward_greedy_speculative(feeds, decoding, multi);
      for (const auto& v : multi) picked.push_back(v.front());
    } else if (greedy)
      engine_->forward_greedy(feeds, picked);
    else
      engine_->forward(feeds, logits);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t V = engine_->config().vocab_size;
  // Decide every outcome first; publish only after the bookkeeping, so that a client that sees its request
  // finish also sees it counted and its slot free.
  struct Outcome {
    int32_t token = -1;  // to publish (-1: none)
    int32_t token2 = -1;  // a speculative step's second token, after `token` (-1: none)
    std::string finish;  // empty: keeps running
  };
  std::vector<Outcome> out(active.size());
  int64_t new_prompt = 0, new_completion = 0, failed = 0, finished = 0;
  for (size_t k = 0; k < active.size(); ++k) {
    Request& r = *active[k];
    if (!error.empty()) {
      out[k].finish = "error";
      ++failed;
      continue;
    }
    const int64_t n = int64_t(r.spec_.prompt.size());
    if (r.fed_ < n) {
      r.fed_ += feeds[k].n;
      new_prompt += feeds[k].n;
      if (r.fed_ < n) continue;  // more prompt chunks to go
    }
    const int32_t t = greedy ? picked[k] : r.sampler_.sample(logits.data() + int64_t(k) * V, V);
    const auto& stop = r.spec_.stop_ids;
    if (std::find(stop.begin(), stop.end(), t) != stop.end()) {
      out[k].finish = "stop";
    } else {
      r.last_ = t;
      ++r.produced_;
      ++new_completion;
      out[k].token = t;
      if (r.produced_ >= r.spec_.max_tokens) out[k].finish = "length";
    }
    // The second token of an accepted draft: the same stop / length rules, after the first.
    if (greedy && spec && multi[k].size() == 2 && out[k].finish.empty()) {
      const int32_t t2 = multi[k][1];
      if (std::find(stop.begin(), stop.end(), t2) != stop.end()) {
        out[k].finish = "stop";
      } else {
        r.last_ = t2;
        ++r.produced_;
        ++new_completion;
        out[k].token2 = t2;
        if (r.produced_ >= r.spec_.max_tokens) out[k].finish = "length";
      }
    }
    if (!out[k].finish.empty()) ++finished;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t k = 0; k < active.size(); ++k)
      if (!out[k].finish.empty()) slots_[size_t(active[k]->slot_)].reset();
    m_.steps += 1;
    m_.step_seconds += dt;
    m_.prompt_tokens += new_prompt;
    m_.completion_tokens += new_completion;
    m_.requests_finished += finished;
    m_.requests_failed += failed;
    m_.cache_bytes = engine_->cache_bytes();
  }
  for (size_t k = 0; k < active.size(); ++k) {
    if (out[k].token >= 0) active[k]->publish(out[k].token);
    if (out[k].token2 >= 0) active[k]->publish(out[k].token2);
    if (!out[k].finish.empty()) active[k]->finish(out[k].finish, out[k].finish == "error" ? error : "");
  }
  if (!error.empty()) log::warn("engine step failed: {}", error);
}

}  // namespace trex::infer
