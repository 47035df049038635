// The planner's activation model (Estimator::activation_elems, bf16 elements per token per block) against the GPU
// model's activation table (model/cuda/activation_plan.h, the bytes the GPU model's pools hold) on V4-Flash
// (../shared/bench/v4-flash.json) at sequence 8192, per recomputation mode, EP (1, 8: under EP both keep the received
// expert-major rows) and TP degree (1, 2, 4: both count a TP
// rank's heads, output groups and shared-expert share, and everything else whole, as T-Rex has no sequence
// parallelism). The two lists differ in detail (the GPU model keeps both router score arrays, its selective mode
// drops more: the normed sub-layer inputs, the mid stream, q, kv and og, and it rebuilds one block where the
// planner reserves the largest block's whole set), so they agree to a stated band: the test prints both and fails
// when the planner drifts from what the trainer allocates by more than that. Seen: none 1.05 / 1.07 / 1.09 x the
// table at tp 1 / 2 / 4, selective 1.13 / 1.17 / 1.21, full 0.94 (the table keeps the indexer's int64 selection,
// 4 KiB per token on a CSA layer).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/files.h"
#include "model/cuda/activation_plan.h"
#include "model/dsv4/config.h"
#include "plan/estimate.h"
#include "plan/model_spec.h"
#include "plan/profiles.h"

namespace {

using namespace trex;

TEST(ActivationTable, PlannerActivationModelAgreesWithTheGpuModelsTable) {
  const std::filesystem::path cfg_path = shared_dir() / "bench" / "v4-flash.json";
  if (!std::filesystem::exists(cfg_path)) GTEST_SKIP() << cfg_path << " not found";
  const dsv4::ModelConfig cfg = dsv4::load_model_config(cfg_path.string());
  const int64_t S = 8192;
  plan::Workload w;
  w.seq = S, w.gbs = 1;
  const plan::Estimator est(plan::load_model_spec(cfg_path.string()), plan::load_hardware("nvidia-h200"),
                            plan::ImplProfile{}, w);
  const dsv4::SeqLayout lay = dsv4::SeqLayout::unpacked(1, S);
  struct Mode {
    dsv4::Recompute gpu;
    plan::Recompute planner;
    double band;  // |planner / table - 1| allowed
  };
  for (const int64_t ep : {1, 8})
  for (const int64_t tp : {1, 2, 4})
  for (const Mode& m : {Mode{dsv4::Recompute::None, plan::Recompute::None, 0.15},
                        Mode{dsv4::Recompute::Selective, plan::Recompute::Selective, 0.35},
                        Mode{dsv4::Recompute::Full, plan::Recompute::Full, 0.15}}) {
    dsv4gpu::ActivationPlanShape shape;
    shape.recompute = m.gpu;
    shape.tp = tp, shape.ep = ep;
    const dsv4gpu::ActivationPlan t = dsv4gpu::plan_activations(cfg, lay, shape);
    // Per block as the planner counts it: the block's own bytes plus its input stream (the planner's blocks
    // include it; the table lists the streams apart), the head excluded.
    const double stream = double(S * cfg.hc_mult * cfg.hidden * 2);
    double table = 0, planner = 0;
    for (int64_t b = 0; b < cfg.n_layers; ++b) {
      table += double(t.blocks[size_t(b)].kept) + stream;
      planner += est.activation_elems(b, m.planner, tp, ep) * 2.0 * double(S);
    }
    const double table_work = double(t.block_scratch);
    double planner_work = 0;  // the planner's recomputation working set: the largest block's none activations
    if (m.planner != plan::Recompute::None)
      for (int64_t b = 0; b < cfg.n_layers; ++b)
        planner_work = std::max(planner_work, est.activation_elems(b, plan::Recompute::None, tp, ep) * 2.0 * double(S));
    std::printf("ep %lld, tp %lld, recompute %-9s: kept over %lld layers: table %.2f GiB, planner %.2f GiB (%.3f); one "
                "block's recompute set: table %.2f GiB, planner %.2f GiB\n",
                static_cast<long long>(ep), static_cast<long long>(tp), dsv4::to_string(m.gpu),
                static_cast<long long>(cfg.n_layers),
                table / double(1ull << 30),
                planner / double(1ull << 30), planner / table, table_work / double(1ull << 30),
                planner_work / double(1ull << 30));
    EXPECT_NEAR(planner / table, 1.0, m.band) << dsv4::to_string(m.gpu) << " tp " << tp << " ep " << ep;
  }
}

}  // namespace
