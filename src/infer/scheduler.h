// Continuous batching over an Engine. One scheduler thread loops: admit queued requests into free slots,
// then run ONE engine step over every active slot (a prompt chunk for newly admitted requests, one token
// for decoding ones), sample, publish the tokens, and free the slots of finished or cancelled requests.
// New requests therefore join between decode steps without waiting for the running ones to finish.
//
// A group of n requests with one prompt (OpenAI `n` > 1, submit_group) takes n slots at once: the first
// prefills the prompt, then the engine copies its caches into the others' slots (Engine::copy_slot) and
// each samples its own continuation, its first token from the same prompt logits.
//
// Clients submit a request and read its tokens as they appear (Request::wait); cancel() (e.g. on client
// disconnect) frees the slot at the next step boundary.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "infer/engine.h"
#include "infer/sampler.h"

namespace trex::infer {

struct RequestSpec {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_ids;  // generation ends (finish_reason "stop") at any of these; not returned
  // OpenAI penalties, in [-2, 2]: before sampling, a token's logit drops by frequency_penalty per time it
  // was generated so far and by presence_penalty once if it was generated at all (the prompt does not count).
  double presence_penalty = 0, frequency_penalty = 0;
  // >= 0: every token comes with its log-probability and the top_logprobs most likely alternatives
  // (the model's log-softmax before temperature, top_p and penalties); -1: none.
  int32_t top_logprobs = -1;
};

constexpr int32_t kMaxTopLogprobs = 20;

struct TokenLogprob {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // most likely first (ties: lower id first)
};

// The log-softmax of `logits` at `token`, and the `k` most likely ids with theirs.
TokenLogprob token_logprob(const float* logits, int64_t n, int32_t token, int32_t k);

// Where a request's time to first token went (steady clock, set by the scheduler): submitted -> admitted into a
// slot (the queue) -> the first engine step that fed it starts -> the step that fed its last prompt chunk
// returns (prefill, with the other requests of those steps) -> its first token is published (sampling and the
// step's bookkeeping).
struct RequestTimeline {
  using Time = std::chrono::steady_clock::time_point;
  Time submitted, admitted, first_step, prompt_done, first_token;
  int64_t admitted_with = 0;         // requests admitted in the same round, this one included
  int64_t steps_to_first_token = 0;  // engine steps it took part in up to its first token, that one included
  int64_t first_token_step_tokens = 0;  // every feed's tokens in the step that gave its first token
};

class Request {
 public:
  // Blocks until new tokens, the end, or the timeout. Appends the new tokens to `out`; returns true once the
  // request has finished and every token was handed out.
  bool wait(std::vector<int32_t>& out, std::chrono::milliseconds timeout,
            std::vector<TokenLogprob>* logprobs = nullptr);  // one per token when the spec asks for them
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Valid after wait() returned true.
  const std::string& finish_reason() const { return finish_reason_; }  // stop | length | cancelled | error
  const std::string& error() const { return error_; }
  int64_t prompt_tokens() const { return int64_t(spec_.prompt.size()); }
  int64_t completion_tokens() const;
  // Valid once the first token was handed out by wait() (timings of a request without one stay zero).
  const RequestTimeline& timeline() const { return timeline_; }

 private:
  friend class Scheduler;
  explicit Request(RequestSpec s) : spec_(std::move(s)), sampler_(spec_.sampling) {}
  void publish(int32_t token, TokenLogprob lp);
  void finish(const std::string& reason, const std::string& error = "");
  // The token to emit from this request's row of logits: penalties applied, then sampled.
  int32_t pick(const float* logits, int64_t n);
  bool needs_logits() const {
    return spec_.sampling.temperature != 0.0 || spec_.presence_penalty != 0 || spec_.frequency_penalty != 0 ||
           spec_.top_logprobs >= 0;
  }

  RequestSpec spec_;
  Sampler sampler_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprob> logprobs_;
  size_t handed_out_ = 0;
  bool finished_ = false;
  std::string finish_reason_, error_;
  // Scheduler-owned progress (touched only by the scheduler thread).
  int64_t slot_ = -1, fed_ = 0, produced_ = 0;
  int32_t last_ = -1;
  std::shared_ptr<Request> leader_;  // group followers: the request that prefills the shared prompt
  bool forked_ = false;              // a follower whose slot holds the prefilled prompt
  std::vector<int32_t> generated_count_;  // per token id, when a penalty is set
  std::vector<float> scratch_;            // penalised logits
  RequestTimeline timeline_;              // written before the token publish that hands it out
};

struct SchedulerOptions {
  int64_t max_queue = 256;      // waiting requests beyond this are refused
  int64_t prefill_chunk = 512;  // prompt tokens per step for one request (bounds step latency)
  // Prompt tokens per step over all requests (0: no bound). A burst of requests admitted together is otherwise
  // prefilled in one step, so even the first of them waits for the whole burst's prefill before its first
  // token; with a bound the prompts go in over several steps, in slot order, and the early ones start decoding
  // while the rest prefill (a lower median time to first token, smaller and so less efficient prefill steps).
  int64_t step_prompt_tokens = 0;
};

struct SchedulerMetrics {
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0, requests_failed = 0,
          requests_rejected = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0, steps = 0;
  int64_t active = 0, queued = 0;
  double step_seconds = 0;  // total time inside engine steps
  int64_t cache_bytes = 0;
};

class Scheduler {
 public:
  Scheduler(std::unique_ptr<Engine> engine, SchedulerOptions opts = {});
  ~Scheduler();  // stops the thread; pending requests finish with "cancelled"
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const Engine& engine() const { return *engine_; }
  // Throws trex::Error for an empty prompt, a prompt + max_tokens beyond the context, bad sampling
  // parameters or a full queue (the message says which).
  std::shared_ptr<Request> submit(RequestSpec spec);
  // n requests sharing spec's prompt (n <= slots); member i samples with seed spec.sampling.seed + i.
  std::vector<std::shared_ptr<Request>> submit_group(RequestSpec spec, int64_t n);
  SchedulerMetrics metrics() const;
  void stop();

 private:
  void loop();
  void step_once(std::vector<std::shared_ptr<Request>>& active);
  void check(const RequestSpec& spec) const;

  std::unique_ptr<Engine> engine_;
  SchedulerOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<std::shared_ptr<Request>>> queue_;  // groups (usually of one request)
  int64_t queued_requests_ = 0;
  std::vector<std::shared_ptr<Request>> slots_;  // slot -> request (null = free)
  SchedulerMetrics m_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace trex::infer
