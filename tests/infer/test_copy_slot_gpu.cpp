// CudaEngine::copy_slot (n > 1 choices sharing a prompt): a slot copied after a prompt long enough to wrap the
// window ring and complete compressed entries of both ratios (and indexer keys) decodes exactly like a slot that
// prefilled the same prompt itself, and afterwards the two evolve independently.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "infer/engine.h"
#include "train/tiny_gpu_config.h"
#include "gpu_engine_test_util.h"

namespace {

using namespace trex;

TEST(GpuEngineCopySlot, CopiedSlotDecodesLikeItsOwnPrefill) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny GPU engine config");
  const int64_t V = cfg.vocab_size;
  infer::CudaEngineOptions o;
  o.slots = 3, o.max_context = 128, o.seed = 17;
  auto e = infer::make_cuda_engine(cfg, nullptr, o);
  std::mt19937 g(3);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 41; ++i) prompt.push_back(int32_t(2 + g() % uint32_t(V - 2)));
  std::vector<float> lg;
  e->forward({{0, prompt.data(), int64_t(prompt.size())}}, lg);
  e->forward({{2, prompt.data(), int64_t(prompt.size())}}, lg);  // the reference: its own prefill
  e->copy_slot(0, 1);
  EXPECT_EQ(e->slot_length(1), int64_t(prompt.size()));
  for (int step = 0; step < 30; ++step) {
    const int32_t t = int32_t(2 + g() % uint32_t(V - 2));
    e->forward({{0, &t, 1}, {1, &t, 1}, {2, &t, 1}}, lg);
    const std::vector<float> r0(lg.begin(), lg.begin() + V), r1(lg.begin() + V, lg.begin() + 2 * V),
        r2(lg.begin() + 2 * V, lg.end());
    ASSERT_LT(test::row_err(r1, r2), 1e-3) << "step " << step << ": the copied slot differs from a fresh prefill";
    ASSERT_LT(test::row_err(r0, r2), 1e-3) << "step " << step;
  }
  // The two slots take their own tokens afterwards: different tokens, different logits.
  int32_t a = 5, b = 9;
  e->forward({{0, &a, 1}, {1, &b, 1}}, lg);
  const std::vector<float> r0(lg.begin(), lg.begin() + V), r1(lg.begin() + V, lg.end());
  EXPECT_GT(test::row_err(r0, r1), 1e-3);
  EXPECT_THROW(e->copy_slot(1, 1), Error);
  EXPECT_THROW(e->copy_slot(0, 3), Error);
}

}  // namespace
