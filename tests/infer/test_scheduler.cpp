// Continuous batching in the scheduler: a request submitted while another runs joins between decode steps
// and finishes first; batching does not change a greedy completion; cancellation frees the slot; limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "infer/engine.h"
#include "infer/generate.h"
#include "infer/scheduler.h"
#include "infer_test_util.h"

using namespace trex;
using namespace trex::infer;

namespace {

std::vector<int32_t> drain(Request& r) {
  std::vector<int32_t> out;
  while (!r.wait(out, std::chrono::milliseconds(200))) {
  }
  return out;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = load_inference_model(test::dsv4_fixture("tiny")); }
  std::shared_ptr<dsv4::Model<float>> model_;
};

TEST_F(SchedulerTest, LateRequestJoinsBetweenStepsAndMatchesItsSoloRun) {
  // Solo greedy reference for the short request.
  const std::vector<int32_t> short_prompt = {0, 17, 99, 23, 180};
  Decoder dec(*model_);
  GenerateOptions go;
  go.max_new_tokens = 5;
  go.min_new_tokens = 5;
  go.stop_ids = {-1};  // no stop token: exactly 5 tokens
  const auto solo = generate(dec, {short_prompt}, go)[0].tokens;

  Scheduler s(make_cpu_engine(model_, 4, 2048));
  RequestSpec longr;
  longr.prompt = {0, 5, 6, 7, 8};
  longr.max_tokens = 1500;
  longr.sampling = {1.0, 1.0, 9};
  auto a = s.submit(longr);
  std::vector<int32_t> got;
  while (got.size() < 3)
    ASSERT_FALSE(a->wait(got, std::chrono::milliseconds(2000))) << "the long request ended early";
  RequestSpec shortr;
  shortr.prompt = short_prompt;
  shortr.max_tokens = 5;
  auto b = s.submit(shortr);
  const auto bt = drain(*b);
  EXPECT_EQ(b->finish_reason(), "length");
  EXPECT_EQ(bt, solo) << "a greedy completion must not depend on what it is batched with";
  std::vector<int32_t> more;
  EXPECT_FALSE(a->wait(more, std::chrono::milliseconds(0)))
      << "the late short request finished while the long one runs";
  for (int i = 0; i < 200 && s.metrics().active > 1; ++i)  // b's slot is freed right after its last token
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(s.metrics().active, 1);
  a->cancel();
  drain(*a);
  EXPECT_EQ(a->finish_reason(), "cancelled");
  EXPECT_LT(a->completion_tokens(), 1500);
  for (int i = 0; i < 100 && s.metrics().active > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.active, 0);
  EXPECT_EQ(m.requests_cancelled, 1);
  EXPECT_EQ(m.requests_finished, 1);
}

TEST_F(SchedulerTest, MoreRequestsThanSlotsQueueAndAllFinish) {
  Scheduler s(make_cpu_engine(model_, 2, 256));
  std::vector<std::shared_ptr<Request>> rs;
  for (int i = 0; i < 7; ++i) {
    RequestSpec r;
    r.prompt = {0, int32_t(10 + i), 42};
    r.max_tokens = 4 + i;
    r.sampling = {0.9, 0.95, uint64_t(i)};
    r.stop_ids = {-1};
    rs.push_back(s.submit(r));
  }
  for (int i = 0; i < 7; ++i) {
    const auto t = drain(*rs[size_t(i)]);
    EXPECT_EQ(int64_t(t.size()), 4 + i);
    EXPECT_EQ(rs[size_t(i)]->finish_reason(), "length");
  }
  const SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.requests_finished, 7);
  EXPECT_EQ(m.completion_tokens, 4 * 7 + 21);
  EXPECT_EQ(m.prompt_tokens, 3 * 7);
}

// The TTFT timeline (bench-serve's breakdown): in order, a 10-token prompt in chunks of 4 takes 3 steps to its first
// token, and a request queued behind a full engine waits in the queue until a slot frees and is admitted alone.
TEST_F(SchedulerTest, TimelineOrdersTheTimeToFirstTokenAndCountsItsSteps) {
  SchedulerOptions so;
  so.prefill_chunk = 4;
  Scheduler s(make_cpu_engine(model_, 1, 256), so);
  RequestSpec r;
  r.prompt = {0, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  r.max_tokens = 3;
  r.stop_ids = {-1};
  auto a = s.submit(r);
  auto b = s.submit(r);  // one slot: b waits for a to finish
  drain(*a);
  drain(*b);
  for (const auto* q : {&a, &b}) {
    const RequestTimeline& t = (*q)->timeline();
    EXPECT_LE(t.submitted, t.admitted);
    EXPECT_LE(t.admitted, t.first_step);
    EXPECT_LT(t.first_step, t.prompt_done);
    EXPECT_LE(t.prompt_done, t.first_token);
    EXPECT_EQ(t.steps_to_first_token, 3) << "10 prompt tokens in chunks of 4";
    EXPECT_EQ(t.first_token_step_tokens, 2) << "the last chunk, alone in its step";
    EXPECT_EQ(t.admitted_with, 1);
  }
  EXPECT_GE(b->timeline().admitted, a->timeline().first_token) << "b took the slot before a finished";
}

// A per-step prompt token budget (SchedulerOptions::step_prompt_tokens): four 10-token prompts under a budget of 10
// finish their prefill in four different steps whatever rounds they were admitted in (no step feeds more than the
// budget's prompt tokens beside one decode token per other slot), and batching them so changes no greedy
// completion.
TEST_F(SchedulerTest, StepPromptBudgetSpreadsABurstsPrefillOverSteps) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i)
    prompts.push_back({0, int32_t(5 + i), 6, 7, 8, 9, 10, 11, int32_t(40 + i), 13});
  Decoder dec(*model_);
  GenerateOptions go;
  go.max_new_tokens = 4;
  go.min_new_tokens = 4;
  go.stop_ids = {-1};
  SchedulerOptions so;
  so.step_prompt_tokens = 10;
  Scheduler s(make_cpu_engine(model_, 4, 256), so);
  std::vector<std::shared_ptr<Request>> rs;
  for (const auto& p : prompts) {
    RequestSpec r;
    r.prompt = p;
    r.max_tokens = 4;
    r.stop_ids = {-1};
    rs.push_back(s.submit(r));
  }
  std::vector<RequestTimeline::Time> done;
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(drain(*rs[i]), generate(dec, {prompts[i]}, go)[0].tokens) << "request " << i;
    const RequestTimeline& t = rs[i]->timeline();
    EXPECT_LE(t.first_token_step_tokens, 10 + 3) << "request " << i << ": a step fed more than the budget";
    done.push_back(t.prompt_done);
  }
  std::sort(done.begin(), done.end());
  EXPECT_EQ(std::adjacent_find(done.begin(), done.end()), done.end()) << "two prompts went in within one step";
  EXPECT_THROW(Scheduler(make_cpu_engine(model_, 1, 64), SchedulerOptions{256, 512, -1}), Error);
}

// copy_slot: a slot forked after the prompt continues exactly as a fresh prefill of the same prompt would.
TEST_F(SchedulerTest, CopiedSlotDecodesLikeAFreshPrefill) {
  auto e = make_cpu_engine(model_, 3, 256);
  const std::vector<int32_t> prompt = {0, 17, 99, 23, 180, 7, 7, 31, 250, 4, 12, 90, 91, 92, 5, 6, 8};
  std::vector<float> a, b;
  e->forward({{0, prompt.data(), int64_t(prompt.size())}}, a);
  e->forward({{2, prompt.data(), int64_t(prompt.size())}}, b);  // the reference: its own prefill
  e->copy_slot(0, 1);
  EXPECT_EQ(e->slot_length(1), int64_t(prompt.size()));
  const int64_t V = e->config().vocab_size;
  std::vector<int32_t> toks = {44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55};
  for (int32_t t : toks) {
    std::vector<float> lg;
    e->forward({{0, &t, 1}, {1, &t, 1}, {2, &t, 1}}, lg);
    // The same computation in different rows of one batch: equal up to the GEMM's row blocking.
    EXPECT_LT(test::rel_max_err(lg.data() + V, lg.data() + 2 * V, V), 1e-5) << "copied slot != fresh prefill";
    EXPECT_LT(test::rel_max_err(lg.data(), lg.data() + 2 * V, V), 1e-5);
  }
  // Slot 1 diverges independently of slot 0 (no shared state).
  int32_t x = 100, y = 200;
  std::vector<float> lg;
  e->forward({{0, &x, 1}, {1, &y, 1}}, lg);
  bool differ = false;
  for (int64_t i = 0; i < V; ++i) differ = differ || lg[size_t(i)] != lg[size_t(V + i)];
  EXPECT_TRUE(differ);
  EXPECT_THROW(e->copy_slot(1, 1), trex::Error);
  EXPECT_THROW(e->copy_slot(0, 3), trex::Error);
}

TEST_F(SchedulerTest, GroupOfNSharesThePromptAndMatchesSeededSoloRuns) {
  Scheduler s(make_cpu_engine(model_, 4, 256));
  RequestSpec r;
  r.prompt = {0, 9, 8, 7, 6, 5};
  r.max_tokens = 6;
  r.sampling = {1.0, 1.0, 40};
  r.stop_ids = {-1};
  r.top_logprobs = 2;
  auto g = s.submit_group(r, 3);
  ASSERT_EQ(g.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> got;
    std::vector<TokenLogprob> lps;
    while (!g[size_t(i)]->wait(got, std::chrono::milliseconds(200), &lps)) {
    }
    RequestSpec solo = r;
    solo.sampling.seed = 40 + uint64_t(i);
    EXPECT_EQ(got, drain(*s.submit(solo))) << "member " << i;
    ASSERT_EQ(lps.size(), got.size());
    for (const auto& lp : lps) {
      ASSERT_EQ(lp.top.size(), 2u);
      EXPECT_GE(lp.top[0].second, lp.top[1].second);
      EXPECT_LE(lp.logprob, lp.top[0].second + 1e-6f);
    }
  }
  EXPECT_EQ(s.metrics().prompt_tokens, 6 + 3 * 6) << "the group prefills its prompt once";
  EXPECT_THROW(s.submit_group(r, 5), trex::Error);  // more than the slots
}

TEST_F(SchedulerTest, RejectsWhatCannotRun) {
  SchedulerOptions so;
  so.max_queue = 0;
  Scheduler s(make_cpu_engine(model_, 1, 64), so);
  RequestSpec r;
  EXPECT_THROW(s.submit(r), trex::Error);  // empty prompt
  r.prompt = std::vector<int32_t>(60, 3);
  r.max_tokens = 5;
  EXPECT_THROW(s.submit(r), trex::Error);  // beyond the context
  r.prompt = {1, 2, 400};
  EXPECT_THROW(s.submit(r), trex::Error);  // outside the vocabulary
  r.prompt = {1, 2};
  r.max_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(s.submit(r), trex::Error);  // prompt + max_tokens would overflow
  r.max_tokens = 5;
  r.sampling.temperature = 1e-310;
  EXPECT_THROW(s.submit(r), trex::Error);  // a denormal temperature
  r.sampling.temperature = 0;
  r.frequency_penalty = 2.5;
  EXPECT_THROW(s.submit(r), trex::Error);
  r.frequency_penalty = 0;
  r.prompt = {1, 2};
  r.sampling.top_p = 0;
  EXPECT_THROW(s.submit(r), trex::Error);
  r.sampling.top_p = 1;
  EXPECT_THROW(s.submit(r), trex::Error);  // queue of size 0 is always full
  EXPECT_EQ(s.metrics().requests_rejected, 1);
}

}  // namespace
