// The GPU model's activation table (model/cuda/activation_plan.h) on the CPU: the three recomputation modes split
// the same per-block requests (none keeps them all, selective drops part, full keeps only the selections), the
// streams and heads do not depend on the mode, and the table scales with the tokens. That the table equals what
// the GPU model's pools hold is RecomputeGpu's (tests/train/test_recompute_gpu.cpp).
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/cuda/activation_plan.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using dsv4::Recompute;

dsv4gpu::ActivationPlan plan(const dsv4::ModelConfig& cfg, const dsv4::SeqLayout& lay, Recompute r, bool mtp,
                             int64_t l0 = 0, int64_t l1 = -1, int64_t full_layers = -1) {
  dsv4gpu::ActivationPlanShape s;
  s.recompute = r, s.mtp = mtp, s.layer_begin = l0, s.layer_end = l1, s.balance = true;
  s.recompute_full_layers = full_layers;
  return dsv4gpu::plan_activations(cfg, lay, s);
}

TEST(ActivationPlan, ModesSplitTheSameBlockRequestsAndFullKeepsOnlyTheSelections) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("plan config", 1);
  const dsv4::SeqLayout lay = dsv4::SeqLayout::packed(128, {{128}, {80, 48}});
  const int64_t N = lay.n_tokens();
  const auto none = plan(cfg, lay, Recompute::None, true), sel = plan(cfg, lay, Recompute::Selective, true),
             full = plan(cfg, lay, Recompute::Full, true);
  ASSERT_EQ(none.blocks.size(), size_t(cfg.n_layers + 1));  // the main layers, then the MTP block
  for (const auto* p : {&sel, &full}) {
    EXPECT_EQ(p->streams, none.streams);
    EXPECT_EQ(p->heads, none.heads);
  }
  EXPECT_EQ(none.block_scratch, 0);
  for (size_t b = 0; b < none.blocks.size(); ++b) {
    EXPECT_EQ(none.blocks[b].dropped, 0);
    EXPECT_EQ(sel.blocks[b].kept + sel.blocks[b].dropped, none.blocks[b].kept) << b;
    EXPECT_EQ(full.blocks[b].kept + full.blocks[b].dropped, none.blocks[b].kept) << b;
    EXPECT_GT(sel.blocks[b].dropped, 0) << b;
    EXPECT_LE(sel.blocks[b].dropped, sel.block_scratch);
    EXPECT_LE(full.blocks[b].dropped, full.block_scratch);
    // Full keeps the router's choice (int32 [N, topk]) and, on the CSA layer, the indexer's (int64 [N, index_topk]).
    const bool csa = b < size_t(cfg.n_layers) && cfg.attn_types[b] == dsv4::AttnType::CSA;
    EXPECT_EQ(full.blocks[b].kept, N * cfg.topk * 4 + (csa ? N * cfg.index_topk * 8 : 0)) << b;
  }
  EXPECT_LT(full.total(), sel.total());
  EXPECT_LT(sel.total(), none.total());
  // The streams: X(0..L), the MTP block's two; bf16 [N, hc, d] each.
  EXPECT_EQ(none.streams, (cfg.n_layers + 3) * N * cfg.hc_mult * cfg.hidden * 2);
}

// recompute_full_layers K: layers below K are planned as full, the later ones and the MTP block as selective; on a
// later stage the global layer index decides. Ignored under selective.
TEST(ActivationPlan, FullOnTheFirstLayersPlansTheRestSelective) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("plan config", 1);
  ASSERT_GE(cfg.n_layers, 2);
  const dsv4::SeqLayout lay = dsv4::SeqLayout::packed(128, {{128}});
  const auto sel = plan(cfg, lay, Recompute::Selective, true), full = plan(cfg, lay, Recompute::Full, true);
  const auto mixed = plan(cfg, lay, Recompute::Full, true, 0, -1, 1);
  for (size_t b = 0; b < mixed.blocks.size(); ++b) {
    const auto& want = b < 1 ? full.blocks[b] : sel.blocks[b];
    EXPECT_EQ(mixed.blocks[b].kept, want.kept) << b;
    EXPECT_EQ(mixed.blocks[b].dropped, want.dropped) << b;
  }
  EXPECT_EQ(mixed.block_scratch, std::max(full.blocks[0].dropped, sel.block_scratch));
  // A stage of layers [1, L): every one of them at or past K = 1, so selective's.
  const auto stage = plan(cfg, lay, Recompute::Full, false, 1, -1, 1);
  const auto stage_sel = plan(cfg, lay, Recompute::Selective, false, 1, -1);
  EXPECT_EQ(stage.kept(), stage_sel.kept());
  const auto k0 = plan(cfg, lay, Recompute::Selective, true, 0, -1, 1);
  EXPECT_EQ(k0.kept(), sel.kept()) << "recompute_full_layers means nothing under selective";
}

TEST(ActivationPlan, ScalesWithTheTokensAndCoversOnlyTheStagesLayers) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("plan config");
  const dsv4::SeqLayout one = dsv4::SeqLayout::unpacked(1, 64), two = dsv4::SeqLayout::unpacked(2, 64);
  // Layer 0 is a sliding layer (no compressed entries): its requests are per token but the router's expert
  // offsets (int32 [E + 1]) and its status flag (one int32), so twice the tokens is twice the bytes less those.
  const auto a = plan(cfg, one, Recompute::None, false, 0, 1), b = plan(cfg, two, Recompute::None, false, 0, 1);
  ASSERT_EQ(a.blocks.size(), 1u);
  EXPECT_EQ(2 * a.blocks[0].kept - b.blocks[0].kept, (cfg.n_routed_experts + 1) * 4 + 4);
  EXPECT_EQ(a.heads, 0) << "a first stage has no head";
  EXPECT_EQ(a.streams, 2 * 64 * cfg.hc_mult * cfg.hidden * 2) << "X(0) and the outgoing X(1)";
  const auto last = plan(cfg, one, Recompute::None, false, 2, 3);
  EXPECT_GT(last.heads, 0);
  EXPECT_THROW(plan(cfg, one, Recompute::None, true), Error) << "the MTP block needs a config with it";
}

}  // namespace
