// Memory-accounting invariants, refusals with reasons, and the search's memory guarantee.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "plan/search.h"

using namespace trex::plan;

namespace {

Estimator make(const std::string& model, const std::string& hw, int64_t gbs, int64_t seq = 4096) {
  Workload w;
  w.seq = seq, w.gbs = gbs, w.mode = "sft";
  return Estimator(model_preset(model), load_hardware(hw), ImplProfile{}, w);
}

}  // namespace

TEST(PlanEstimate, ZeroOneDividesOptimizerStateByDataParallelism) {
  Estimator e = make("flash", "nvidia-h200", 256);
  Layout a = parse_layout("TP1,PP4,EP8,MBS1,ZERO=1");
  Layout b = a;
  Estimate small_dp = e.estimate(a, 32);  // DP 8
  Estimate big_dp = e.estimate(b, 64);    // DP 16, same per-rank model shard
  ASSERT_TRUE(small_dp.valid && big_dp.valid) << small_dp.reason << big_dp.reason;
  EXPECT_DOUBLE_EQ(small_dp.mem.weights, big_dp.mem.weights);
  EXPECT_NEAR(big_dp.mem.optimizer / small_dp.mem.optimizer, 0.5, 0.02);
  // With EP1 the expert data-parallel group is the whole DP group: ZeRO-1 divides all state by DP = 16.
  Estimate z1 = e.estimate(parse_layout("TP1,PP4,EP1,MBS1,ZERO=1"), 64);
  Estimate z0 = e.estimate(parse_layout("TP1,PP4,EP1,MBS1,ZERO=0"), 64);
  EXPECT_NEAR(z0.mem.optimizer / z1.mem.optimizer, 16.0, 1e-6);
  // With EP8 experts shard over EDP = 16 / 8 = 2 only, dense state over 16.
  Estimate z0ep = e.estimate(parse_layout("TP1,PP4,EP8,MBS1,ZERO=0"), 64);
  const double ratio = z0ep.mem.optimizer / big_dp.mem.optimizer;
  EXPECT_GT(ratio, 2.0);
  EXPECT_LT(ratio, 16.0);
}

TEST(PlanEstimate, PipelineDividesLayersAndExpertParallelDividesExperts) {
  Estimator e = make("pro", "ascend-910c-cm384", 1024);
  Estimate pp4 = e.estimate(parse_layout("TP2,PP4,EP64,RC=full"), 512);
  Estimate pp8 = e.estimate(parse_layout("TP2,PP8,EP64,RC=full"), 512);
  ASSERT_TRUE(pp4.valid && pp8.valid) << pp4.reason << pp8.reason;
  int64_t total4 = 0, total8 = 0;
  for (auto n : pp4.stage_blocks) total4 += n;
  for (auto n : pp8.stage_blocks) total8 += n;
  EXPECT_EQ(total4, 62);  // 61 blocks + MTP, every block on exactly one stage
  EXPECT_EQ(total8, 62);
  EXPECT_LE(*std::max_element(pp8.stage_blocks.begin(), pp8.stage_blocks.end()), 9);
  EXPECT_LT(pp8.mem.weights, 0.6 * pp4.mem.weights);  // about half the blocks per rank
  Estimate ep32 = e.estimate(parse_layout("TP2,PP8,EP32,RC=full"), 512);
  Estimate ep16 = e.estimate(parse_layout("TP2,PP8,EP16,RC=full"), 512);
  ASSERT_TRUE(ep32.valid && ep16.valid) << ep32.reason << ep16.reason;
  // The expert share of the weights halves each time EP doubles; the dense share stays.
  const double step_16_32 = ep16.mem.weights - ep32.mem.weights, step_32_64 = ep32.mem.weights - pp8.mem.weights;
  EXPECT_NEAR(step_16_32 / step_32_64, 2.0, 1e-9);
  EXPECT_GT(pp8.mem.weights - step_32_64, 0);  // dense part
}

TEST(PlanEstimate, RecomputationTradesMemoryForTime) {
  Estimator e = make("flash", "nvidia-h200", 128);
  Estimate none = e.estimate(parse_layout("TP1,PP4,EP32,RC=none"), 128);
  Estimate sel = e.estimate(parse_layout("TP1,PP4,EP32,RC=selective"), 128);
  Estimate full = e.estimate(parse_layout("TP1,PP4,EP32,RC=full"), 128);
  EXPECT_GT(none.mem.activations, sel.mem.activations);
  EXPECT_GT(sel.mem.activations, full.mem.activations);
  EXPECT_LT(none.time.compute, full.time.compute);
  // Full recomputation adds one forward to forward + backward (= 3 forwards); the LM head is not recomputed.
  EXPECT_NEAR(full.time.recompute / (full.time.compute - full.time.recompute), 1.0 / 3.0, 0.02);
  EXPECT_EQ(none.flops_per_token, full.flops_per_token);  // recomputation is never counted in MFU
}

// RC=full,RCL=K: the first K layers replay in full, the rest recompute selectively; memory grows and time falls as
// K falls, from full's (K = every layer and the MTP block) towards selective's; the layout string round-trips.
TEST(PlanEstimate, FullOnTheFirstLayersLiesBetweenFullAndSelective) {
  Estimator e = make("flash", "nvidia-h200", 128, 8192);
  const Estimate sel = e.estimate(parse_layout("TP1,PP1,EP128,RC=selective,ZERO=2"), 128);
  const Estimate full = e.estimate(parse_layout("TP1,PP1,EP128,RC=full,ZERO=2"), 128);
  double last_act = full.mem.activations, last_t = full.time.compute;
  for (int64_t k : {40, 30, 20, 10, 0}) {
    const Layout l = parse_layout(fmt::format("TP1,PP1,EP128,DP128,RC=full,RCL={},ZERO=2", k));
    EXPECT_EQ(l.rc_full_layers, k);
    EXPECT_EQ(parse_layout(to_string(l)).rc_full_layers, k) << to_string(l);
    const Estimate m = e.estimate(l, 128);
    EXPECT_GT(m.mem.activations, last_act) << k;
    EXPECT_LT(m.time.compute, last_t) << k;
    EXPECT_LE(m.mem.activations, sel.mem.activations + 1e-9) << k;
    EXPECT_GE(m.time.compute, sel.time.compute - 1e-9) << k;
    last_act = m.mem.activations, last_t = m.time.compute;
  }
  try {
    parse_layout("TP1,RC=selective,RCL=3");
    ADD_FAILURE() << "RCL accepted without RC=full";
  } catch (const trex::Error& ex) {
    EXPECT_NE(std::string(ex.what()).find("RCL"), std::string::npos) << ex.what();
  }
}

TEST(PlanEstimate, ImpossibleLayoutsAreRefusedWithAReason) {
  Estimator e = make("pro", "ascend-910c-cm384", 1024);
  auto reason = [&](const char* layout, int64_t devices) { return e.estimate(parse_layout(layout), devices).reason; };
  EXPECT_NE(reason("TP3,PP8,EP64", 512).find("does not divide"), std::string::npos);
  EXPECT_NE(reason("TP2,PP8,EP100", 512).find("routed experts"), std::string::npos);
  EXPECT_NE(reason("TP32,PP1,EP64", 512).find("heads"), std::string::npos);
  EXPECT_NE(reason("TP2,PP8,VPP8,EP64", 512).find("virtual stages"), std::string::npos);
  EXPECT_NE(reason("TP2,PP8,EP64,MBS3", 512).find("global batch"), std::string::npos);
  EXPECT_NE(reason("TP2,PP1,EP64", 512).find("GiB"), std::string::npos);  // valid but out of memory
  EXPECT_FALSE(e.estimate(parse_layout("TP2,PP1,EP64"), 512).fits);
  Workload w;
  w.gbs = 8, w.precision = Precision::FP8;
  Estimator fp8(model_preset("flash"), load_hardware("ascend-910c-cm384"), ImplProfile{}, w);
  EXPECT_NE(fp8.estimate(parse_layout("TP1,PP1,EP8"), 8).reason.find("FP8"), std::string::npos);
  EXPECT_THROW(parse_layout("TP2,XX4"), trex::Error);
  EXPECT_THROW(parse_layout("TP0"), trex::Error);
}

// A search restricted by a predicate (trex plan --search --runnable: the layouts the GPU trainer runs) returns only
// accepted layouts, counts the others as refused, and its best is the best accepted layout of the full search.
TEST(PlanSearch, AcceptPredicateKeepsOnlyAcceptedLayouts) {
  Estimator e = make("flash", "nvidia-h200", 128);
  const SearchResult all = search_layouts(e, 128, 100000, false);
  const SearchResult tp1 = search_layouts(e, 128, 5, false, [](const Layout& l) { return l.tp == 1; });
  ASSERT_FALSE(tp1.best.empty());
  EXPECT_EQ(tp1.considered, all.considered);
  EXPECT_GT(tp1.refused, all.refused);
  for (const Estimate& x : tp1.best) EXPECT_EQ(x.layout.tp, 1) << to_string(x.layout);
  const Estimate* first = nullptr;
  for (const Estimate& x : all.best)
    if (x.layout.tp == 1) {
      first = &x;
      break;
    }
  ASSERT_NE(first, nullptr);
  EXPECT_DOUBLE_EQ(tp1.best[0].mfu, first->mfu) << to_string(tp1.best[0].layout) << " vs " << to_string(first->layout);
}

TEST(PlanSearch, NeverReturnsALayoutThatExceedsMemory) {
  for (const char* model : {"flash", "pro"}) {
    Estimator e = make(model, "nvidia-h200", 512);
    SearchResult r = search_layouts(e, 512, 20, false);
    ASSERT_FALSE(r.best.empty()) << model;
    EXPECT_GT(r.out_of_memory, 0);
    for (size_t i = 0; i < r.best.size(); ++i) {
      const Estimate& x = r.best[i];
      EXPECT_TRUE(x.valid && x.fits) << to_string(x.layout);
      EXPECT_LE(x.mem.total, x.mem.capacity) << to_string(x.layout);
      if (i > 0) EXPECT_GE(r.best[i - 1].mfu, x.mfu);
      // Re-estimating the returned layout gives the same answer.
      EXPECT_DOUBLE_EQ(e.estimate(x.layout, 512).mem.total, x.mem.total);
    }
  }
}

TEST(PlanEstimate, MfuConventionsAreConsistent) {
  Estimator e = make("pro", "ascend-910c-cm384", 1024);
  Estimate x = e.estimate(parse_layout("TP2,PP8,VPP2,EP64,RC=full,OFF=swap"), 512);
  ASSERT_TRUE(x.valid) << x.reason;
  const double tok_s_dev = 1024.0 * 4096.0 / x.time.step / 512.0;
  EXPECT_NEAR(x.tokens_per_s_per_device, tok_s_dev, 1e-6 * tok_s_dev);
  EXPECT_NEAR(x.mfu, tok_s_dev * 324.3e9 / 376e12, 0.002);
  EXPECT_NEAR(x.mfu_6n / x.mfu, 293.1 / 324.3, 0.002);
}

// Tensor parallelism as T-Rex runs it (GpuModelOptions::tp): the split projections and the attention heads are
// divided over the TP ranks, everything else is whole on each of them, with no sequence parallelism. So under full
// recomputation a TP rank keeps the same block inputs as a TP1 rank (every token's residual streams), the logits
// are the whole vocabulary's, the per-token activations drop only by the heads' / groups' / shared expert's share,
// and the compute of the replicated work (the routed experts above all) is not divided: a TP2 rank is far from
// half a TP1 rank's time. (A Megatron-style SP estimate would halve all of these.)
TEST(PlanEstimate, TensorParallelismWithoutSequenceParallelism) {
  Estimator e = make("flash", "nvidia-h200", 128);
  const ModelSpec m = model_preset("flash");
  const double nh = double(m.n_heads), c = double(m.head_dim), g = double(m.o_groups), dg = double(m.o_lora_rank);
  const double fs = double(m.moe_inter * m.n_shared_experts);
  for (int64_t b = 0; b < m.n_layers; ++b) {
    EXPECT_DOUBLE_EQ(e.activation_elems(b, Recompute::Full, 2), e.activation_elems(b, Recompute::Full, 1)) << b;
    // Q before / after its norm, the output O and its rotated copy, the softmax statistics, the grouped output,
    // the shared expert's gate|up: the TP-split activations, halved at tp 2.
    const double split = 4 * nh * c + 2 * nh + g * dg + 2 * fs;
    EXPECT_NEAR(e.activation_elems(b, Recompute::None, 1) - e.activation_elems(b, Recompute::None, 2), split / 2,
                1e-6 * split)
        << b;
  }
  const Estimate one = e.estimate(parse_layout("TP1,PP1,EP64,MBS1,RC=full"), 64);
  const Estimate two = e.estimate(parse_layout("TP2,PP1,EP64,MBS1,RC=full"), 128);  // the same dp 64
  ASSERT_TRUE(one.valid && two.valid) << one.reason << " / " << two.reason;
  ASSERT_EQ(one.micro_batches, two.micro_batches);
  EXPECT_DOUBLE_EQ(two.mem.logits, one.mem.logits) << "the head is not split over TP";
  EXPECT_LT(two.mem.activations, one.mem.activations) << "the recomputed block's split activations";
  EXPECT_GT(two.mem.activations, 0.75 * one.mem.activations) << "the kept block inputs are whole on a TP rank";
  EXPECT_LT(two.mem.weights, one.mem.weights);
  EXPECT_GT(two.mem.weights, 0.5 * one.mem.weights) << "only wq_b, wo_a, wo_b, sinks and the shared expert split";
  EXPECT_GT(two.time.compute, 0.6 * one.time.compute) << "the replicated work runs on every TP rank";
  EXPECT_LT(two.time.compute, one.time.compute);
  EXPECT_GT(two.time.tp, 0.0);
  std::printf("V4-Flash TP1 / TP2 at dp 64, ep 64, full recompute: activations %.2f / %.2f GiB, weights %.2f / %.2f "
              "GiB, compute %.3f / %.3f s per step\n",
              one.mem.activations, two.mem.activations, one.mem.weights, two.mem.weights, one.time.compute,
              two.time.compute);
}

// Expert tensor parallelism as T-Rex runs it (etp = tp, GpuModelOptions::expert_tp): each TP rank holds and
// computes its 1 / tp share of each of its EP rank's experts, on the same tokens as at etp 1 (no sequence
// parallelism), with no expert replica added. So against TP2 at etp 1 on the same dp / ep: the experts' weights
// (and their gradients and optimizer state) halve, the experts' GEMM time halves, the gate|up activations of the
// routed copies halve, and the TP all-reduces gain only the gate weights' gradients ([tokens, topk] fp32).
TEST(PlanEstimate, ExpertTensorParallelismSplitsTheExpertsOverTheTpRanks) {
  Estimator e = make("flash", "nvidia-h200", 128);
  const ModelSpec m = model_preset("flash");
  const double K = double(m.topk), f = double(m.moe_inter);
  for (int64_t b = 0; b < m.n_layers; ++b)
    EXPECT_NEAR(e.activation_elems(b, Recompute::None, 2, 64, 1) - e.activation_elems(b, Recompute::None, 2, 64, 2),
                K * f, 1e-6 * K * f)
        << b << ": the routed copies' gate|up at half the width";
  const Estimate whole = e.estimate(parse_layout("TP2,PP1,EP64,MBS1,RC=full"), 128);
  const Estimate split = e.estimate(parse_layout("TP2,PP1,EP64,ETP2,MBS1,RC=full"), 128);
  ASSERT_TRUE(whole.valid && split.valid) << whole.reason << " / " << split.reason;
  ASSERT_EQ(whole.layout.dp, split.layout.dp);
  EXPECT_LT(split.mem.weights, whole.mem.weights);
  EXPECT_LT(split.mem.optimizer, whole.mem.optimizer);
  EXPECT_LT(split.time.compute, 0.9 * whole.time.compute) << "the experts' GEMMs halve";
  EXPECT_GT(split.time.tp, whole.time.tp) << "the gate weights' gradients are summed over TP";
  EXPECT_LT(split.time.tp, 1.05 * whole.time.tp) << "and nothing else is added";
  std::printf("V4-Flash TP2 etp 1 / etp 2 at dp 64, ep 64, full recompute: weights %.2f / %.2f GiB, optimizer "
              "%.2f / %.2f GiB, compute %.3f / %.3f s, TP %.4f / %.4f s per step\n",
              whole.mem.weights, split.mem.weights, whole.mem.optimizer, split.mem.optimizer, whole.time.compute,
              split.time.compute, whole.time.tp, split.time.tp);
}
