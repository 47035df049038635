// The planner's per-rank parameter state under dp x ep (plan/rank_memory.h) against an independent count from the
// parameter table and the partition rules (dsv4::partition_holds with the rank's expert range), against the
// invariants of the layout (every expert held by dp / ep ranks, every master element owned once, the fp32-read
// tensors on every rank), and against the planner's estimate (its weights per rank are the same tensors plus the
// router biases, which the GPU keeps outside the trained arena). tests/train/test_gpu_mesh_ep_gpu.cpp compares the
// same numbers with what the GPU trainer allocates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "model/dsv4/param_table.h"
#include "model/dsv4/partition.h"
#include "plan/model_math.h"
#include "plan/model_spec.h"
#include "plan/rank_memory.h"
#include "plan/search.h"
#include "train/tiny_gpu_config.h"

using namespace trex;
using namespace trex::plan;

namespace {

struct Counts {
  int64_t held = 0, dense_bf16 = 0, dense_f32 = 0, experts_held = 0, buffers = 0;
};

// The same partition from other pieces: the model's own rule for which tensors a partition holds.
Counts independent(const dsv4::ModelConfig& cfg, int64_t ep, int64_t ep_rank) {
  dsv4::ModelPartition p;
  p.expert_begin = ep_rank * (cfg.n_routed_experts / ep);
  p.expert_end = p.expert_begin + cfg.n_routed_experts / ep;
  p = p.resolved(cfg);
  Counts c;
  for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) {
    if (s.kind == dsv4::ParamKind::HashTable) continue;
    const int64_t n = numel(s.shape);
    if (!s.trained()) {
      c.buffers += n;
      continue;
    }
    if (!dsv4::partition_holds(p, s, cfg.n_mtp > 0)) continue;
    c.held += n;
    if (s.expert >= 0)
      c.experts_held += n;
    else
      (dsv4::keeps_fp32(s.name) ? c.dense_f32 : c.dense_bf16) += n;
  }
  return c;
}

}  // namespace

TEST(PlanRankMemory, MatchesThePartitionRulesAndTheLayoutInvariants) {
  dsv4::ModelConfig tiny = trex::testing::tiny_gpu_config("tiny");
  dsv4::ModelConfig flash = model_config(model_preset("flash"));
  flash.n_mtp = 0;
  for (const dsv4::ModelConfig* cfg : {&tiny, &flash}) {
    const Counts whole = independent(*cfg, 1, 0);
    for (int64_t dp : {1, 2, 4, 8})
      for (int64_t ep : {1, 2, 4, 8}) {
        if (dp % ep != 0) continue;
        double owned_sum = 0;
        for (int64_t r = 0; r < dp; ++r) {
          const RankParamState s = rank_param_state(*cfg, dp, ep, r);
          const Counts c = independent(*cfg, ep, r % ep);
          EXPECT_EQ(s.held(), c.held) << "dp=" << dp << " ep=" << ep << " rank " << r;
          EXPECT_EQ(s.experts, c.experts_held) << "dp=" << dp << " ep=" << ep << " rank " << r;
          EXPECT_EQ(s.experts * ep, whole.experts_held) << "E / ep experts per rank";
          const double want = double(c.dense_bf16) / double(dp) + double(c.dense_f32) +
                              double(c.experts_held) / double(dp / ep);
          EXPECT_NEAR(s.owned, want, 1e-9 * want) << "dp=" << dp << " ep=" << ep << " rank " << r;
          EXPECT_DOUBLE_EQ(s.weight_bytes(), 2.0 * double(s.held()));
          EXPECT_DOUBLE_EQ(s.optimizer_bytes(), 12.0 * s.owned);
          owned_sum += s.owned;
        }
        // Over the ranks every bf16-read dense and every expert element is owned once, the fp32-read ones dp times.
        const double total = double(whole.dense_bf16 + whole.experts_held) + double(dp) * double(whole.dense_f32);
        EXPECT_NEAR(owned_sum, total, 1e-9 * total) << "dp=" << dp << " ep=" << ep;
      }
  }
  EXPECT_THROW(rank_param_state(tiny, 4, 3, 0), Error);  // ep does not divide dp
  EXPECT_THROW(rank_param_state(tiny, 3, 3, 0), Error);  // 3 does not divide the 8 experts
}

// Tensor parallelism: each split tensor (dsv4::tp_split_axis) counts 1 / tp of its elements on every TP rank, the
// rest whole; so over the tp ranks the split ones sum to the model's and the others are held tp times.
TEST(PlanRankMemory, TensorParallelRanksHoldTheirSliceOfTheSplitTensors) {
  const dsv4::ModelConfig tiny = trex::testing::tiny_gpu_config("rank memory tp test");
  int64_t split = 0, split_f32 = 0;
  for (const dsv4::ParamSpec& s : dsv4::param_table(tiny))
    if (s.trained() && dsv4::tp_split_axis(s.name, dsv4::TpExperts::Whole) >= 0) {
      split += numel(s.shape);
      if (s.dtype == DType::F32) split_f32 += numel(s.shape);
    }
  ASSERT_GT(split, 0);
  for (int64_t tp : {2, 4}) {
    if (tiny.o_groups % tp != 0) continue;
    const RankParamState one = rank_param_state(tiny, 2, 2, 1), t = rank_param_state(tiny, 2, 2, 1, 1, tp);
    EXPECT_EQ(t.experts, one.experts) << "expert TP = 1: the routed experts are not split";
    EXPECT_EQ(t.dense, one.dense - split + split / tp) << tp;
    // The split bf16-read tensors' masters are ZeRO-1 sharded over dp = 2 as the rest; the sinks (fp32) are not.
    EXPECT_NEAR(t.owned, one.owned - double(split - split_f32) * (1.0 - 1.0 / double(tp)) / 2.0 -
                             double(split_f32) * (1.0 - 1.0 / double(tp)),
                1e-6)
        << tp;
  }
  EXPECT_THROW(rank_param_state(tiny, 1, 1, 0, 1, 3), Error);  // 3 does not split the 4 heads' wq_b rows
}

// Expert tensor parallelism (etp = tp): each routed expert's w1 / w3 rows and w2 columns are split too, so a TP
// rank holds 1 / tp of its EP rank's experts and the dense part as at etp 1; etp must be 1 or tp.
TEST(PlanRankMemory, ExpertTensorParallelRanksHoldTheirSliceOfTheirExperts) {
  const dsv4::ModelConfig tiny = trex::testing::tiny_gpu_config("rank memory etp test");
  for (int zero : {1, 2}) {
    const RankParamState whole = rank_param_state(tiny, 2, 2, 1, zero, 2);
    const RankParamState split = rank_param_state(tiny, 2, 2, 1, zero, 2, 2);
    EXPECT_EQ(split.dense, whole.dense);
    EXPECT_EQ(2 * split.experts, whole.experts);
    EXPECT_NEAR(whole.owned - split.owned, double(whole.experts - split.experts), 1e-6)
        << "ep = dp: no expert replica, each rank owns its experts' (slices') state whole";
  }
  // Without expert parallelism the (split) experts sit in the layer buckets, ZeRO-sharded with them.
  EXPECT_EQ(2 * rank_param_state(tiny, 2, 1, 0, 1, 2, 2).experts, rank_param_state(tiny, 2, 1, 0, 1, 2).experts);
  EXPECT_THROW(rank_param_state(tiny, 2, 2, 0, 1, 2, 4), Error);  // etp is 1 or tp
}

TEST(PlanRankMemory, AgreesWithTheEstimatorsWeightsPerRank) {
  Workload w;
  w.seq = 4096, w.gbs = 64, w.mode = "cpt", w.mtp = false, w.frozen_router = false;
  const ModelSpec spec = model_preset("flash");
  Estimator est(spec, load_hardware("nvidia-h200"), ImplProfile{}, w);
  dsv4::ModelConfig cfg = model_config(spec);
  cfg.n_mtp = 0;
  const int64_t buffers = independent(cfg, 1, 0).buffers;  // router biases: in the planner's count, no GPU arena
  // With tp: the estimator's split tensors are the GPU model's (dsv4::tp_split_axis), the rest whole per TP rank.
  for (const char* layout :
       {"TP1,PP1,EP8,MBS1", "TP1,PP1,EP16,MBS1", "TP1,PP1,EP64,MBS1", "TP2,PP1,EP8,MBS1", "TP2,PP1,EP32,MBS1",
        "TP4,PP1,EP16,MBS1", "TP2,PP1,EP8,ETP2,MBS1", "TP4,PP1,EP16,ETP4,MBS1"}) {
    const Estimate e = est.estimate(parse_layout(layout), 64);
    ASSERT_TRUE(e.valid) << layout << ": " << e.reason;
    const RankParamState s = rank_param_state(cfg, e.layout.dp, e.layout.ep, 0, 1, e.layout.tp, e.layout.etp);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const double planner_params = e.mem.weights * gib / ImplProfile{}.weight_bytes;
    std::printf("%s: estimator %.0f parameters per rank, rank state %lld held + %lld router-bias elements\n", layout,
                planner_params, (long long)s.held(), (long long)buffers);
    EXPECT_NEAR(planner_params, double(s.held() + buffers), 1.0) << layout;
    EXPECT_NEAR(e.mem.grads * gib / ImplProfile{}.grad_bytes, double(s.held() + buffers), 1.0) << layout;
  }
}

// ZeRO-2 (parallel.zero 2): the persistent fp32 gradients of the bucketed tensors are a 1/dp share (the bf16-read
// dense tensors, and the experts when ep = 1: they are in their layer's bucket), the fp32-read ones and, under
// ep > 1, the experts' stay whole; weights and optimiser state are ZeRO-1's. The estimator's ZERO=2
// gradients are the same share (the experts whole) plus its transient bucket buffers: two blocks and the
// embedding and head, bounded above by the ZeRO-1 count for a large model.
TEST(PlanRankMemory, ZeroTwoShardsTheDenseGradients) {
  dsv4::ModelConfig flash = model_config(model_preset("flash"));
  flash.n_mtp = 0;
  for (int64_t dp : {2, 8})
    for (int64_t ep : {1, 2}) {
      const Counts c = independent(flash, ep, 0);
      const RankParamState z1 = rank_param_state(flash, dp, ep, 0, 1), z2 = rank_param_state(flash, dp, ep, 0, 2);
      EXPECT_DOUBLE_EQ(z1.grads, double(z1.held()));
      EXPECT_EQ(z2.held(), z1.held());
      EXPECT_DOUBLE_EQ(z2.owned, z1.owned);
      const double experts = ep == 1 ? double(c.experts_held) / double(dp) : double(c.experts_held);
      const double want = double(c.dense_bf16) / double(dp) + double(c.dense_f32) + experts;
      EXPECT_NEAR(z2.grads, want, 1e-9 * want) << "dp=" << dp << " ep=" << ep;
      EXPECT_DOUBLE_EQ(z2.grad_bytes(), 4.0 * z2.grads);
    }
  EXPECT_THROW(rank_param_state(flash, 2, 1, 0, 4), Error);  // zero 1, 2 and 3 only

  Workload w;
  w.seq = 4096, w.gbs = 64, w.mode = "cpt", w.mtp = false, w.frozen_router = false;
  const ModelSpec spec = model_preset("flash");
  Estimator est(spec, load_hardware("nvidia-h200"), ImplProfile{}, w);
  const Estimate e1 = est.estimate(parse_layout("TP1,PP1,EP8,MBS1"), 64);
  const Estimate e2 = est.estimate(parse_layout("TP1,PP1,EP8,MBS1,ZERO=2"), 64);
  ASSERT_TRUE(e1.valid && e2.valid) << e1.reason << " / " << e2.reason;
  EXPECT_EQ(e2.layout.zero, 2);
  EXPECT_LT(e2.mem.grads, e1.mem.grads);
  EXPECT_DOUBLE_EQ(e2.mem.weights, e1.mem.weights);
  EXPECT_DOUBLE_EQ(e2.mem.optimizer, e1.mem.optimizer);
  std::printf("flash EP8 dp64: grads per rank ZeRO-1 %.2f GiB, ZeRO-2 %.2f GiB\n", e1.mem.grads, e2.mem.grads);
}

// ZeRO-2 on the last of two stages with MTP: the MTP module's gradients are a root bucket of their own
// (GradBuckets::transient_bytes: two of the largest layer's buffers plus every root bucket), so turning MTP on adds
// the module's persistent share (its dense tensors and its embedding copy at 1/dp, its experts at 1/ep, whole per
// owner) and its whole fp32 bucket buffer (dense tensors + embedding copy), never a third layer buffer. Counted
// here from the parameter table; the emulated V4-Pro last stage (pp 2, dp 256, ep 128) allocates this buffer.
TEST(PlanRankMemory, ZeroTwoLastStageKeepsTheMtpModulesBucketBuffer) {
  dsv4::ModelConfig flash = model_config(model_preset("flash"));
  ASSERT_EQ(flash.n_mtp, 1);
  double mtp_dense = 0, mtp_experts = 0, embed = 0;
  for (const dsv4::ParamSpec& s : dsv4::param_table(flash)) {
    if (!s.trained()) continue;
    const double n = double(numel(s.shape));
    if (s.name == "embed.weight") embed = n;
    if (s.part != dsv4::ParamPart::Mtp) continue;
    (s.expert >= 0 ? mtp_experts : mtp_dense) += n;
  }
  ASSERT_GT(mtp_dense, 0);
  ASSERT_GT(mtp_experts, 0);
  Workload w;
  w.seq = 4096, w.gbs = 64, w.mode = "cpt", w.frozen_router = false;
  const ModelSpec spec = model_preset("flash");
  const Layout l = parse_layout("TP1,PP2,EP8,MBS1,ZERO=2");
  // The same layers on each stage both ways (the balanced split would move one): 22 + 21, the MTP block last.
  std::vector<int64_t> first, last;
  for (int64_t b = 0; b < flash.n_layers; ++b) (b < 22 ? first : last).push_back(b);
  auto estimate = [&](bool mtp) {
    w.mtp = mtp;
    Estimator est(spec, load_hardware("nvidia-h200"), ImplProfile{}, w);
    std::vector<int64_t> tail = last;
    if (mtp) tail.push_back(flash.n_layers);
    est.set_partition(2, 1, {first, tail});
    return est.estimate(l, 64);
  };
  const Estimate with = estimate(true), without = estimate(false);
  ASSERT_TRUE(with.valid && without.valid) << with.reason << " / " << without.reason;
  ASSERT_EQ(with.stage_mem.size(), size_t(2));
  const double dp = double(with.layout.dp), ep = double(with.layout.ep);
  ASSERT_EQ(dp, 32);
  const double want = 4.0 * ((mtp_dense + embed) / dp + mtp_experts / ep + mtp_dense + embed);
  const double got = (with.stage_mem[1].grads - without.stage_mem[1].grads) * double(1ull << 30);
  EXPECT_NEAR(got, want, 1e-3 * want);
  // The first stage neither holds the module nor its buffer.
  EXPECT_NEAR(with.stage_mem[0].grads, without.stage_mem[0].grads, 1e-9);
  std::printf("flash PP2 EP8 dp32 ZeRO-2, last stage: MTP adds %.3f GiB of gradients (buffer %.3f GiB)\n",
              got / double(1ull << 30), 4.0 * (mtp_dense + embed) / double(1ull << 30));
}

// The tiny GPU config's ZeRO-2 gradient count, pinned by hand from its shapes (tests/train/tiny_gpu_config.h:
// d 64, 3 layers, 8 routed experts of f 32, one shared expert, vocabulary 256, hc 4): each routed expert is
// 3 x 32 x 64 = 6144 elements, 8 x 3 x 6144 = 147456 in all. Without expert parallelism they are in the layer
// buckets and ZeRO-2 keeps 1/dp of their gradients (GradBuckets); with ep = 2 each rank keeps its 4 experts'
// gradients whole (region X). tests/train/test_gpu_zero_gpu.cpp (GpuZeroMemory) compares the same counts with
// what each GPU rank allocates.
TEST(PlanRankMemory, ZeroTwoGradientsOfTheTinyGpuConfig) {
  const dsv4::ModelConfig tiny = trex::testing::tiny_gpu_config("rank memory zero 2 test");
  const Counts c = independent(tiny, 1, 0);
  ASSERT_EQ(c.experts_held, 147456);
  // The dense tensors: the planner's ZeRO-1 count less the experts, split by the dtype the GPU reads them in.
  const RankParamState one = rank_param_state(tiny, 1, 1, 0, 1);
  EXPECT_EQ(one.dense, c.dense_bf16 + c.dense_f32);
  EXPECT_EQ(one.experts, 147456);
  for (int64_t dp : {2, 4}) {
    double sum = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const RankParamState z2 = rank_param_state(tiny, dp, 1, r, 2);
      EXPECT_DOUBLE_EQ(z2.grads, double(c.dense_bf16 + 147456) / double(dp) + double(c.dense_f32)) << dp;
      sum += z2.grads;
    }
    // Over the ranks: every bucketed gradient once, the replicated fp32-read ones on every rank.
    EXPECT_DOUBLE_EQ(sum, double(c.dense_bf16 + 147456) + double(dp) * double(c.dense_f32)) << dp;
  }
  // GpuZeroMemory's config (the vocabulary widened to 320 for its corpus' tokenizer), dp 2 without ep: its two
  // GPU ranks hold 316339 and 315411 gradient elements (the H200 run of tests/train/test_gpu_zero_gpu.cpp; the
  // bucket padding sits in rank 1's slices), 631750 in all, which the planner's two shares sum to.
  dsv4::ModelConfig wide = tiny;
  wide.vocab_size = 320;
  EXPECT_DOUBLE_EQ(rank_param_state(wide, 2, 1, 0, 2).grads + rank_param_state(wide, 2, 1, 1, 2).grads, 631750.0);
  for (int64_t r = 0; r < 4; ++r) {  // dp 4 x ep 2: 4 experts of 8 per rank, whole
    const RankParamState z2 = rank_param_state(tiny, 4, 2, r, 2);
    EXPECT_EQ(z2.experts, 147456 / 2);
    EXPECT_DOUBLE_EQ(z2.grads, double(c.dense_bf16) / 4.0 + double(c.dense_f32) + 147456.0 / 2.0) << r;
  }
}

// ZeRO-3 (parallel.zero 3): ZeRO-2's gradients and ZeRO-1's optimiser state, and the persistent bf16 weights of
// everything in the data-parallel buckets as a 1/dp share: the bf16-read dense tensors, and with ep 1 the routed
// experts too (they sit in their layer's bucket); with ep > 1 the experts and always the fp32-read tensors whole.
// The gathered buffers peak at two of the largest layer plus the embedding and the head.
TEST(PlanRankMemory, ZeroThreeShardsTheDenseWeights) {
  dsv4::ModelConfig flash = model_config(model_preset("flash"));
  flash.n_mtp = 0;
  // The root units and the largest layer's bucket, from the table.
  int64_t roots = 0;
  std::map<int64_t, int64_t> dense_layer, expert_layer;
  for (const dsv4::ParamSpec& s : dsv4::param_table(flash)) {
    if (!s.trained() || dsv4::keeps_fp32(s.name)) continue;
    if (s.part != dsv4::ParamPart::Layer)
      roots += numel(s.shape);
    else
      (s.expert >= 0 ? expert_layer : dense_layer)[s.layer] += numel(s.shape);
  }
  for (int64_t dp : {2, 8})
    for (int64_t ep : {1, 2}) {
      const Counts c = independent(flash, ep, 0);
      const RankParamState z2 = rank_param_state(flash, dp, ep, 0, 2), z3 = rank_param_state(flash, dp, ep, 0, 3);
      EXPECT_EQ(z3.held(), z2.held());
      EXPECT_DOUBLE_EQ(z3.owned, z2.owned);
      EXPECT_DOUBLE_EQ(z3.grads, z2.grads);
      EXPECT_DOUBLE_EQ(z2.weights, double(z2.held()));  // ZeRO-2 keeps the whole bf16 copy
      const double experts = ep == 1 ? double(c.experts_held) / double(dp) : double(c.experts_held);
      const double want = double(c.dense_bf16) / double(dp) + double(c.dense_f32) + experts;
      EXPECT_NEAR(z3.weights, want, 1e-9 * want) << "dp=" << dp << " ep=" << ep;
      EXPECT_DOUBLE_EQ(z3.weight_bytes(), 2.0 * z3.weights);
      int64_t largest = 0;
      for (const auto& [l, n] : dense_layer)
        largest = std::max(largest, n + (ep == 1 ? expert_layer[l] : 0));
      EXPECT_DOUBLE_EQ(z3.gathered, double(2 * largest + roots)) << "dp=" << dp << " ep=" << ep;
      EXPECT_DOUBLE_EQ(z3.gather_bytes(), 2.0 * z3.gathered);
      EXPECT_DOUBLE_EQ(z2.gathered, 0.0);
    }
  // One rank: nothing to shard or gather.
  const RankParamState one = rank_param_state(flash, 1, 1, 0, 3);
  EXPECT_DOUBLE_EQ(one.weights, double(one.held()));
  EXPECT_DOUBLE_EQ(one.gathered, 0.0);
}
