// The planner's per-step communication by kind (plan/comm_volume.h): the bytes and calls of one rank's
// collectives, counted as comm::EmulatedGroup counts them, against what an emulated rank recorded; the counting
// rules per ZeRO level and pipeline stage; ZeRO-3 on pipeline stages.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/config.h"
#include "model/dsv4/param_table.h"
#include "plan/comm_volume.h"
#include "plan/estimate.h"
#include "plan/model_spec.h"
#include "plan/profiles.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const plan::CommKind* find(const plan::RankComm& c, const std::string& dim, const std::string& op) {
  for (const auto& k : c.kinds)
    if (k.dim == dim && k.op == op && k.kind.find("count") == std::string::npos) return &k;
  return nullptr;
}

// V4-Flash CPT 4096, pp=1 dp=128 ep=128, full recomputation, ZeRO-1, rank 0 (MTP left out, as the emulation
// runs it): measured by --sections on the emulated rank (`trex bench train --config v4-flash.json --seq 4096
// --batch 128 --mode cpt --emulate-rank 0 --layout pp=1,dp=128,ep=128 --recompute full --warmup 1 --steps 2
// --sections`, docs/performance.md), whose `emulated_comm_total` sums the warm-up and the two timed steps:
// the DP group's reduce_scatter 81.3 GiB in 135 calls, the EP group's all_to_all_v 144 GiB in 1032 calls.
TEST(PlanCommVolume, FlashPp1RankMatchesTheEmulatedRanksCounts) {
  const std::filesystem::path cfg = shared_dir() / "bench" / "v4-flash.json";
  if (!std::filesystem::exists(cfg)) GTEST_SKIP() << cfg << " not found";
  plan::Workload w;
  w.seq = 4096, w.gbs = 128, w.mode = "cpt", w.frozen_router = false, w.mtp = false;
  plan::Estimator est(plan::load_model_spec(cfg.string()), plan::load_hardware("nvidia-h200"),
                      plan::load_impl("trex-prior"), w);
  plan::Layout l = plan::parse_layout("PP1,EP128,DP128,MBS1,RC=full");
  const plan::Estimate e = est.estimate(l, 128);
  ASSERT_TRUE(e.valid) << e.reason;
  ASSERT_EQ(e.stage_comm.size(), 1u);
  const plan::RankComm& c = e.stage_comm[0];
  const double steps = 3;  // warm-up + two timed steps in the recorded totals
  const plan::CommKind* rs = find(c, "dp", "reduce_scatter");
  ASSERT_NE(rs, nullptr);
  EXPECT_NEAR(steps * rs->bytes / kGiB, 81.3, 0.813);
  EXPECT_EQ(steps * double(rs->calls), 135);  // 43 layer buckets + the embedding's + the head's, per step
  // The EP group's all_to_all_v: the exchange and the expert-count exchange together, as the emulation counts.
  EXPECT_NEAR(steps * c.bytes("all_to_all_v") / kGiB, 144.0, 1.44);
  EXPECT_EQ(steps * double(c.calls("all_to_all_v")), 1032);  // 8 per layer: 3 fwd, 3 replay, 2 bwd
  // No expert replicas (ep = dp): no expert reduce-scatter; no pipeline or TP traffic.
  EXPECT_EQ(find(c, "edp", "reduce_scatter"), nullptr);
  EXPECT_EQ(c.calls("send") + c.calls("recv"), 0);
  // The emulated rank's exchange: every peer's block copied (128 copies a call), its bytes read and written.
  const plan::CommKind* a2a = find(c, "ep", "all_to_all_v");
  ASSERT_NE(a2a, nullptr);
  EXPECT_EQ(a2a->copies, a2a->calls * 128);
  const plan::ImplProfile ip = plan::load_impl("trex-prior");
  const plan::HardwareProfile hw = plan::load_hardware("nvidia-h200");
  EXPECT_NEAR(a2a->emulated_s, a2a->moved * 2 / (hw.hbm_bw * ip.eff_hbm) + double(a2a->copies) * ip.emulated_copy_s,
              1e-9);
  EXPECT_GT(e.stage_alone[0], e.stage_alone_none[0]);  // count-only moves the small ones only
}

// The counting rules on a tiny model: ZeRO-1 reduces once per step, ZeRO-2 / 3 in every backward; ZeRO-3 gathers
// a layer's bucket twice per micro-batch and skips the post-step gather; pipeline boundaries send / receive once per
// micro-batch each way.
TEST(PlanCommVolume, CountsFollowTheTrainersReductionPoints) {
  const nlohmann::json j = trex::testing::tiny_gpu_config_json();
  const dsv4::ModelConfig cfg = dsv4::parse_model_config(j, "tiny");
  plan::Workload w;
  w.seq = 64, w.gbs = 16, w.frozen_router = false, w.mtp = false;
  plan::Estimator est(plan::parse_model_spec(j, "tiny"), plan::load_hardware("nvidia-h200"),
                      plan::load_impl("trex-prior"), w);
  est.set_partition(2, 1, {{0, 1}, {2}});
  const plan::BucketTable t = plan::bucket_table(cfg, true, 1);
  auto run = [&](int zero) {
    plan::Layout l;
    l.pp = 2, l.dp = 4, l.ep = 2, l.zero = zero;
    const plan::Estimate e = est.estimate(l, 8);
    EXPECT_TRUE(e.valid) << e.reason;
    return e;
  };
  const plan::Estimate z1 = run(1), z2 = run(2), z3 = run(3);
  const int64_t M = z1.micro_batches;
  ASSERT_EQ(M, 4);
  // Stage 0: embedding + layers 0, 1; stage 1: layer 2 + head.
  const int64_t units0 = 3, units1 = 2;
  EXPECT_EQ(find(z1.stage_comm[0], "dp", "reduce_scatter")->calls, units0);
  EXPECT_EQ(find(z1.stage_comm[1], "dp", "reduce_scatter")->calls, units1);
  EXPECT_EQ(find(z2.stage_comm[0], "dp", "reduce_scatter")->calls, M * units0);
  EXPECT_EQ(find(z1.stage_comm[0], "dp", "all_gather")->calls, units0);
  EXPECT_EQ(find(z3.stage_comm[0], "dp", "all_gather")->calls, M * (1 + 2 * 2));
  const double bytes0 = 4.0 * double(plan::padded_bucket(t.embed, 4) + plan::padded_bucket(t.block[0], 4) +
                                     plan::padded_bucket(t.block[1], 4));
  EXPECT_DOUBLE_EQ(find(z1.stage_comm[0], "dp", "reduce_scatter")->bytes, bytes0);
  // Region X (this rank's experts over dp / ep = 2 replicas): once per step.
  EXPECT_EQ(find(z2.stage_comm[0], "edp", "reduce_scatter")->calls, 1);
  // Pipeline: stage 0 sends activations and receives gradients, M each; stage 1 the reverse.
  EXPECT_EQ(z1.stage_comm[0].calls("send"), M);
  EXPECT_EQ(z1.stage_comm[0].calls("recv"), M);
  const double elems = 64.0 * double(cfg.hc_mult) * double(cfg.hidden);
  EXPECT_DOUBLE_EQ(z1.stage_comm[0].bytes("send"), double(M) * elems * 2);  // bf16 activations
  EXPECT_DOUBLE_EQ(z1.stage_comm[1].bytes("send"), double(M) * elems * 4);  // fp32 gradients
  // TP all-reduces only with tp > 1.
  for (const auto& k : z1.stage_comm[0].kinds) EXPECT_NE(k.dim, "tp") << k.kind;
}

// ZeRO-3 on pipeline stages: each stage gathers only its own root units (the embedding on the first, the head
// on the last), so the first stage's gathered weights carry no head and the last's no embedding.
TEST(PlanCommVolume, ZeroThreeOnPipelineStagesCountsEachStagesRootUnits) {
  const nlohmann::json j = trex::testing::tiny_gpu_config_json();
  plan::Workload w;
  w.seq = 64, w.gbs = 16, w.frozen_router = false, w.mtp = false;
  plan::Estimator est(plan::parse_model_spec(j, "tiny"), plan::load_hardware("nvidia-h200"),
                      plan::load_impl("trex-prior"), w);
  est.set_partition(2, 1, {{0, 1}, {2}});
  plan::Layout l;
  l.pp = 2, l.dp = 4, l.ep = 2, l.zero = 3;
  const plan::Estimate e = est.estimate(l, 8);
  ASSERT_TRUE(e.valid) << e.reason;
  const plan::ParamCounts pc = est.math().params();
  const double wb = est.impl().weight_bytes;
  for (int s = 0; s < 2; ++s) {
    double dense = 0, experts = 0, biggest = 0;
    for (int64_t b : (s == 0 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{2})) {
      const plan::BlockParams& p = est.math().block_params(b);
      dense += p.sharded + p.replicated;
      experts += p.experts / 2;
      biggest = std::max(biggest, p.sharded + p.replicated);
    }
    const double root = s == 0 ? pc.embed : pc.head;
    if (s == 0) dense += pc.embed;
    if (s == 1) dense += pc.head + pc.final_misc;
    const double expect = (dense / 4 + experts) * wb + (2 * biggest + root) * wb;
    EXPECT_NEAR(e.stage_mem[size_t(s)].weights * kGiB, expect, 1.0) << "stage " << s;
  }
}

}  // namespace
