// ZeRO-1 on one process: the bucket layout (ownership balanced, every tensor exactly once, parts tiled
// without overlap, buckets in ready order) and the sharded optimiser over the local communicator, which
// must reproduce optim::Optimizer bit for bit. Multi-process equivalence is in test_zero1_mpi.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"
#include "parallel/zero1_optimizer.h"
#include "train/toy_model.h"
#include "zero1_test_util.h"

using namespace trex;
using namespace trex::parallel;

namespace {

// Every invariant the reducer relies on; returns the largest tensor for the balance bound.
void check_plan(const ShardPlan& plan, const std::vector<int64_t>& numels, int ranks, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(plan.ranks, ranks);
  std::vector<int> seen(numels.size(), 0);
  std::vector<int64_t> owned(size_t(ranks), 0);
  int last_tensor = -1;
  for (const auto& b : plan.buckets) {
    ASSERT_FALSE(b.slots.empty());
    std::vector<std::vector<std::pair<int64_t, int64_t>>> spans(static_cast<size_t>(ranks));
    for (const auto& s : b.slots) {
      ASSERT_GE(s.tensor, 0);
      ASSERT_LT(size_t(s.tensor), numels.size());
      EXPECT_GT(s.tensor, last_tensor) << "buckets and slots follow the ready order";
      last_tensor = s.tensor;
      seen[size_t(s.tensor)]++;
      ASSERT_GE(s.owner, 0);
      ASSERT_LT(s.owner, ranks);
      EXPECT_EQ(s.numel, numels[size_t(s.tensor)]);
      spans[size_t(s.owner)].push_back({s.offset, s.offset + s.numel});
      owned[size_t(s.owner)] += s.numel;
    }
    for (auto& sp : spans) {  // each rank's tensors tile [0, load) of its part, which fits the padded part
      std::sort(sp.begin(), sp.end());
      int64_t at = 0;
      for (auto [lo, hi] : sp) {
        EXPECT_EQ(lo, at);
        at = hi;
      }
      EXPECT_LE(at, b.part_elems);
    }
  }
  for (size_t t = 0; t < numels.size(); ++t) EXPECT_EQ(seen[t], 1) << "tensor " << t;
  EXPECT_EQ(owned, plan.owned_elems);
  const int64_t biggest = numels.empty() ? 0 : *std::max_element(numels.begin(), numels.end());
  const auto [lo, hi] = std::minmax_element(owned.begin(), owned.end());
  EXPECT_LE(*hi - *lo, biggest) << "owners balanced within the largest tensor";
}

}  // namespace

TEST(Zero1Layout, EveryTensorOnceBalancedAndTiled) {
  uint64_t s = 7;
  std::vector<int64_t> numels;
  for (int i = 0; i < 60; ++i) numels.push_back(1 + int64_t(data::splitmix64(s) % 5000));
  numels[10] = 40000;  // one tensor much larger than a bucket
  for (int ranks : {1, 2, 3, 4, 8})
    for (int64_t bucket : {int64_t(1), int64_t(4096), int64_t(30000), int64_t(1) << 30}) {
      ShardPlan p = plan_shards(numels, ranks, bucket);
      check_plan(p, numels, ranks, fmt::format("ranks {} bucket {}", ranks, bucket));
      // Deterministic: the same inputs give the same plan (every rank computes it independently).
      ShardPlan q = plan_shards(numels, ranks, bucket);
      ASSERT_EQ(p.buckets.size(), q.buckets.size());
      for (size_t b = 0; b < p.buckets.size(); ++b)
        for (size_t k = 0; k < p.buckets[b].slots.size(); ++k) {
          EXPECT_EQ(p.buckets[b].slots[k].owner, q.buckets[b].slots[k].owner);
          EXPECT_EQ(p.buckets[b].slots[k].offset, q.buckets[b].slots[k].offset);
        }
      if (bucket == (int64_t(1) << 30)) {
        EXPECT_EQ(p.buckets.size(), 1u);
      }
      if (bucket == 4096) {
        EXPECT_GE(p.buckets.size(), 8u);
      }
      if (ranks == 1) {
        EXPECT_EQ(p.padding_elems(), 0);
      }
    }
  // Equal tensors, a multiple of the rank count per bucket: no padding at all.
  std::vector<int64_t> equal(32, 100);
  ShardPlan e = plan_shards(equal, 4, 800);
  check_plan(e, equal, 4, "equal");
  EXPECT_EQ(e.padding_elems(), 0);
  EXPECT_EQ(e.buckets.size(), 4u);
  // Modest padding on the mixed list with a practical bucket size.
  ShardPlan m = plan_shards(numels, 4, 30000);
  EXPECT_LT(double(m.padding_elems()), 0.5 * double(m.total_elems()));
  EXPECT_THROW(plan_shards(numels, 0, 10), Error);
}

namespace {

void expect_same_params(train::Trainable& a, train::Trainable& b, const std::string& what) {
  auto pa = a.params(), pb = b.params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(std::memcmp(pa[i].value, pb[i].value, size_t(pa[i].numel()) * sizeof(float)), 0)
        << what << ": " << pa[i].name;
}

}  // namespace

// One rank: ZeRO-1 must be the plain optimiser exactly (same update rules on the same gradients), with
// several buckets, hooks reporting in backward order, and clipping active or not.
TEST(Zero1Local, MatchesOptimizerBitForBit) {
  auto local = comm::make_local_communicator();
  auto local2 = comm::make_local_communicator();
  for (const char* kind : {"adamw", "muon"})
    for (double clip : {0.0, 0.05}) {
      const std::string what = fmt::format("{} clip {}", kind, clip);
      train::ToyLM ref(24, 8, 5), dp(24, 8, 5);
      optim::Optimizer opt(ref.params(), zero1_test::optimizer_config(kind, clip));
      Zero1Optimizer zero(dp.params(), zero1_test::optimizer_config(kind, clip), *local, *local2, nullptr, {200});
      ASSERT_GT(zero.dense().n_buckets(), 1) << "the test wants several buckets";
      EXPECT_EQ(zero.experts().n_buckets(), 0);
      for (int64_t step = 0; step < 3; ++step) {
        auto mb = [&](int64_t i) { return zero1_test::make_batch(24, 2, 6, step, i); };
        double ref_norm = 0;
        const double ref_loss = zero1_test::reference_step(ref, opt, 2, 1e-2, mb, &ref_norm);
        if (clip > 0) {
          EXPECT_GT(ref_norm, clip) << "clipping must be active";
        }
        dp.zero_grads();
        double loss = dp.forward_backward(mb(0)).loss / 2;
        zero.begin_grad_sync(0.5);
        loss += dp.forward_backward(mb(1)).loss / 2;
        auto ps = dp.params();
        for (auto it = ps.rbegin(); it != ps.rend(); ++it) zero.on_grads_ready({it->name});
        EXPECT_EQ(zero.buckets_started(), zero.n_buckets());
        zero.finish_grad_sync();
        EXPECT_EQ(loss, ref_loss);
        EXPECT_NEAR(zero.clip_gradients(), ref_norm, 1e-9 * ref_norm) << what;
        zero.step(1e-2);
        expect_same_params(ref, dp, what);
      }
      EXPECT_EQ(zero.steps_done(), 3);
      // Every state tensor of the plain optimiser, by name, with the same values.
      auto a = opt.state_tensors(), b = zero.state_tensors();
      ASSERT_EQ(a.size(), b.size());
      for (const auto& s : a) {
        auto it = std::find_if(b.begin(), b.end(), [&](const optim::StateTensor& t) { return t.name == s.name; });
        ASSERT_NE(it, b.end()) << s.name;
        EXPECT_EQ(std::memcmp(s.data, it->data, size_t(numel(s.shape)) * sizeof(float)), 0) << s.name;
      }
    }
}

TEST(Zero1Local, BucketsStartAsSoonAsFullAndInOrder) {
  auto local = comm::make_local_communicator();
  train::ToyLM m(24, 8, 5);
  // Ready order: head, norm, w1, embed; buckets of 8 elements put each tensor in its own bucket.
  Zero1Optimizer zero(m.params(), zero1_test::optimizer_config("adamw", 0), *local, *local, nullptr, {8});
  ASSERT_EQ(zero.n_buckets(), 4);
  m.zero_grads();
  zero.on_grads_ready({"head.weight"});  // not armed: ignored
  EXPECT_EQ(zero.buckets_started(), 0);
  zero.begin_grad_sync();
  m.forward_backward(zero1_test::make_batch(24, 1, 6, 0, 0));
  zero.on_grads_ready({"layers.0.ffn.w1.weight"});  // bucket 2 full, but bucket 0 is not: wait
  EXPECT_EQ(zero.buckets_started(), 0);
  zero.on_grads_ready({"head.weight"});
  EXPECT_EQ(zero.buckets_started(), 1);
  zero.on_grads_ready({"norm.weight"});  // buckets 1 and then 2 start
  EXPECT_EQ(zero.buckets_started(), 3);
  EXPECT_THROW(zero.on_grads_ready({"norm.weight"}), Error);
  EXPECT_THROW(zero.on_grads_ready({"no.such.tensor"}), Error);
  zero.finish_grad_sync();  // embed was never reported: finish starts it
  EXPECT_THROW(zero.finish_grad_sync(), Error);
  EXPECT_EQ(zero.owner_of("head.weight"), 0);
  EXPECT_TRUE(zero.owns("embed.weight"));
}

TEST(Zero1Local, ExpertLoadsAndExpertNames) {
  EXPECT_TRUE(is_expert_param("layers.3.ffn.experts.17.w2.weight"));
  EXPECT_FALSE(is_expert_param("layers.3.ffn.shared_experts.w2.weight"));
  EXPECT_FALSE(is_expert_param("layers.3.ffn.gate.weight"));
  auto local = comm::make_local_communicator();
  std::vector<std::vector<int64_t>> loads = {{1, 2}, {}, {3}};
  all_reduce_expert_loads(*local, loads);
  EXPECT_EQ(loads, (std::vector<std::vector<int64_t>>{{1, 2}, {}, {3}}));
}
