// The planner's per-stage numbers with a given partition (Estimator::set_partition, Estimate::stage_mem /
// stage_compute), which rank emulation compares with one rank: each stage's weights, gradients and optimizer
// state are those of the parameter table's tensors on that stage (experts / EP, dense state / DP), and a
// partition that does not cover the blocks in order is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "model/dsv4/config.h"
#include "model/dsv4/param_table.h"
#include "plan/estimate.h"
#include "plan/model_spec.h"
#include "plan/profiles.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

TEST(PlanStageEstimate, GivenPartitionCountsEachStagesTensors) {
  const nlohmann::json j = trex::testing::tiny_gpu_config_json();
  const dsv4::ModelConfig cfg = dsv4::parse_model_config(j, "tiny");
  plan::Workload w;
  w.seq = 64, w.gbs = 8, w.frozen_router = false, w.mtp = false;
  plan::Estimator est(plan::parse_model_spec(j, "tiny"), plan::load_hardware("nvidia-h200"),
                      plan::load_impl("trex-prior"), w);
  EXPECT_THROW(est.set_partition(2, 1, {{0}, {2}}), trex::Error);
  EXPECT_THROW(est.set_partition(2, 1, {{0, 1}}), trex::Error);
  est.set_partition(2, 1, {{0, 1}, {2}});
  plan::Layout l;
  l.pp = 2, l.dp = 4, l.ep = 4;
  const plan::Estimate e = est.estimate(l, 8);
  ASSERT_TRUE(e.valid) << e.reason;
  ASSERT_EQ(e.stage_mem.size(), 2u);
  ASSERT_EQ(e.stage_compute.size(), 2u);
  EXPECT_EQ(e.stage_blocks, (std::vector<int64_t>{2, 1}));
  const double gib = 1024.0 * 1024.0 * 1024.0;
  for (int s = 0; s < 2; ++s) {
    double dense = 0, experts = 0;
    for (const dsv4::ParamSpec& p : dsv4::param_table(cfg)) {
      if (p.kind == dsv4::ParamKind::HashTable) continue;
      const bool mine = (p.part == dsv4::ParamPart::Layer && (s == 0 ? p.layer < 2 : p.layer == 2)) ||
                        (p.part == dsv4::ParamPart::Embed && s == 0) || (p.part == dsv4::ParamPart::Head && s == 1);
      if (!mine) continue;
      (p.expert >= 0 ? experts : dense) += double(numel(p.shape));
    }
    const plan::MemoryBreakdown& m = e.stage_mem[size_t(s)];
    EXPECT_EQ(m.stage, s);
    EXPECT_NEAR(m.weights * gib, 2 * (dense + experts / 4), 1e-3) << "stage " << s;
    EXPECT_NEAR(m.grads * gib, 4 * (dense + experts / 4), 1e-3) << "stage " << s;
    EXPECT_NEAR(m.optimizer * gib, 12 * (dense / 4 + experts / 4), 1e-3) << "stage " << s;  // EDP 1
    EXPECT_GT(e.stage_compute[size_t(s)], 0);
  }
  EXPECT_GE(e.mem.total, std::max(e.stage_mem[0].total, e.stage_mem[1].total) - 1e-12);
}

}  // namespace

namespace {
// Interleaved stages: the GPU trainer's chunks are models of their own, each keeping its own recomputation buffer
// (one block's full activations) for the step, so a stage holding the same blocks in vpp chunks counts vpp of
// them. With every layer a sliding one (the same activations per block), stage 0's four blocks in one chunk (vpp 1:
// {0..3}) or two (vpp 2: virtual stages 0 and 2, {0, 1} and {4, 5}) save the same, with the same micro-batches in
// flight (M = 2 caps both), so the activations differ by exactly one block's buffer.
TEST(PlanStageEstimate, InterleavedChunksEachKeepARecomputationBuffer) {
  nlohmann::json j = trex::testing::tiny_gpu_config_json();
  j["num_hidden_layers"] = 8;
  j["compress_ratios"] = nlohmann::json::array();
  for (int l = 0; l < 8; ++l) j["compress_ratios"].push_back(0);
  plan::Workload w;
  w.seq = 64, w.gbs = 4, w.frozen_router = false, w.mtp = false;
  const plan::ImplProfile ip = plan::load_impl("trex-prior");
  plan::Estimator est(plan::parse_model_spec(j, "tiny8"), plan::load_hardware("nvidia-h200"), ip, w);
  est.set_partition(2, 1, {{0, 1, 2, 3}, {4, 5, 6, 7}});
  est.set_partition(2, 2, {{0, 1}, {2, 3}, {4, 5}, {6, 7}});  // virtual stage c on rank c % 2
  for (plan::Recompute rc : {plan::Recompute::Full, plan::Recompute::Selective, plan::Recompute::None}) {
    plan::Layout l;
    l.pp = 2, l.dp = 2, l.recompute = rc;  // 4 sequences over dp 2: M = 2
    const plan::Estimate one = est.estimate(l, 4);
    l.vpp = 2;
    const plan::Estimate two = est.estimate(l, 4);
    ASSERT_TRUE(one.valid && two.valid) << one.reason << two.reason;
    ASSERT_EQ(one.stage_mem[0].inflight, two.stage_mem[0].inflight);
    double max_block = 0;
    for (int64_t b : {0, 1, 4, 5}) max_block = std::max(max_block, est.activation_elems(b, plan::Recompute::None));
    const double buffer = rc == plan::Recompute::None ? 0.0 : max_block * 2 * 64 * ip.act_scale / (1024.0 * 1024 * 1024);
    EXPECT_NEAR(two.stage_mem[0].activations - one.stage_mem[0].activations, buffer, 1e-12)
        << "recompute " << plan::to_string(rc);
    if (rc != plan::Recompute::None) EXPECT_GT(buffer, 0);
  }
}
}  // namespace

namespace {
// The workspace term (MemoryBreakdown::workspace) against the shapes the GPU model allocates, as the emulated V4-Pro
// ranks of TP2,PP2,VPP2,EP128,DP128 counted them before allocating on the H200 (`trex bench train --emulate-rank 0`
// and `256`, docs/performance.md): gradient streams 2.19 GiB on the first stage (its first chunk embeds: 5 fp32
// [4096, 4, 7168] streams) and 2.62 on the second (6), the pipeline boundary 2.62 on both (interleaved: every
// chunk sends and receives), one MoE backward's temporaries 3.75 GiB per chunk pair (2 chunks x 4096 tokens x 6
// routed rows x (4 d + 4 f) bf16). The LM head's row-block scratch is counted under logits, not here.
TEST(PlanStageEstimate, WorkspaceIsWhatTheGpuModelAllocatesPerChunk) {
  plan::Workload w;
  w.seq = 4096, w.gbs = 256, w.mode = "sft";
  plan::Estimator est(plan::model_preset("pro"), plan::load_hardware("nvidia-h200"), plan::load_impl("trex-prior"),
                      w);
  const plan::Estimate e = est.estimate(plan::parse_layout("TP2,PP2,VPP2,EP128,DP128,MBS1,RC=full,ZERO=3"), 512);
  ASSERT_TRUE(e.valid) << e.reason;
  ASSERT_EQ(e.stage_mem.size(), 2u);
  EXPECT_NEAR(e.stage_mem[0].workspace, 2.1875 + 2.625 + 3.75, 1e-3);
  EXPECT_NEAR(e.stage_mem[1].workspace, 2.625 + 2.625 + 3.75, 1e-3);
  // One stage, no pipeline: two streams on the embedding (and only) chunk, one MoE backward, no boundary.
  const plan::Estimate one = est.estimate(plan::parse_layout("TP1,PP1,EP128,DP256,MBS1,RC=full,ZERO=2"), 256);
  ASSERT_TRUE(one.valid) << one.reason;
  EXPECT_NEAR(one.stage_mem[0].workspace, 2 * 0.4375 + 3.75 / 2, 1e-3);
}
}  // namespace
