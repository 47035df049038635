// The activation arena's host side: a region's stack bookkeeping (model/cuda/arena_region.h), which decides where
// every activation of a GPU training step lives once the arena is planned, and the activation table's numbers
// (model/cuda/activation_plan.h) for one tiny layer against a count of its tensors by hand. The device side (no
// allocation after the plan, the same outputs as without the arena) is ActivationArenaGpu's
// (tests/train/test_activation_arena_gpu.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "model/cuda/activation_plan.h"
#include "model/cuda/arena_region.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using dsv4gpu::ArenaRegion;

std::shared_ptr<void> host_memory(int64_t bytes) {
  auto v = std::make_shared<std::vector<char>>(size_t(bytes));
  return std::shared_ptr<void>(v, v->data());
}

TEST(ArenaRegion, PlacesAlignedRequestsOnAStackAndFallsBackBeyondItsCapacity) {
  auto mem = host_memory(1024);
  char* base = static_cast<char*>(mem.get());
  ArenaRegion r(mem, base, 1024);
  const auto a = r.push(100), b = r.push(1), c = r.push(256);
  EXPECT_EQ(a.ptr, base);
  EXPECT_EQ(b.ptr, base + 256) << "256-byte aligned, as cudaMallocAsync";
  EXPECT_EQ(c.ptr, base + 512);
  EXPECT_EQ(r.in_use(), 768);
  const auto d = r.push(300);  // would end at 1068 > 1024
  EXPECT_EQ(d.ptr, nullptr);
  EXPECT_EQ(d.offset, 768);
  EXPECT_EQ(r.overflows(), 1);
  EXPECT_EQ(r.high_water(), ArenaRegion::align_up(1068)) << "what the requests needed, whatever the capacity";
  r.release(d.id);
  r.release(c.id);
  EXPECT_EQ(r.in_use(), 257) << "the top is b's end again";
  const auto e = r.push(8);
  EXPECT_EQ(e.ptr, base + 512) << "c's bytes go to the next request";
  EXPECT_THROW(r.release(c.id + 5), Error);
}

TEST(ArenaRegion, ADeadEntryLeavesTheStackOnceNothingLiveIsAboveIt) {
  auto mem = host_memory(4096);
  ArenaRegion r(mem, static_cast<char*>(mem.get()), 4096);
  const auto a = r.push(256), b = r.push(256), c = r.push(256);
  r.release(a.id);  // below live entries: stays
  EXPECT_EQ(r.in_use(), 768);
  r.release(c.id);
  EXPECT_EQ(r.in_use(), 512);
  r.release(b.id);  // b, then the dead a below it, leave
  EXPECT_EQ(r.in_use(), 0);
  EXPECT_TRUE(r.empty());
  EXPECT_THROW(r.release(b.id), Error) << "released twice";
}

TEST(ArenaRegion, TheSameRequestsFitWithoutFallbackInARegionOfTheirHighWaterMark) {
  // An op's temporaries and a block's pools interleaved: the sequence a step makes, twice.
  auto run = [](ArenaRegion& r) {
    std::vector<ArenaRegion::Placed> p;
    p.push_back(r.push(1000));  // a pool that lives across the sequence
    for (int op = 0; op < 3; ++op) {
      const auto t1 = r.push(300 + 100 * op), t2 = r.push(5000);
      r.release(t2.id), r.release(t1.id);
    }
    p.push_back(r.push(7));
    r.release(p[1].id), r.release(p[0].id);
  };
  ArenaRegion measure;  // capacity 0: every request falls back, the bookkeeping is the plan
  run(measure);
  EXPECT_EQ(measure.overflows(), 8);
  EXPECT_TRUE(measure.empty());
  const int64_t need = measure.high_water();
  EXPECT_EQ(need, 1024 + 512 + 5120);  // the first pool, the largest op's first temporary, its second
  auto mem = host_memory(need);
  ArenaRegion planned(mem, static_cast<char*>(mem.get()), need);
  run(planned);
  EXPECT_EQ(planned.overflows(), 0);
  EXPECT_EQ(planned.high_water(), need);
}

// ---- the activation table of one tiny layer, counted by hand ----

// Layer 0 of the tiny GPU config: sliding attention (no compressor, no indexer), a hash-routed MoE with a shared
// expert; d 64, 4 streams, 4 heads of 256, q rank 32, 2 output groups of rank 16, 8 experts, top-2, width 32.
TEST(ActivationPlan, OneTinySlidingLayerCountedTensorByTensor) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("arena table config");
  ASSERT_EQ(cfg.hidden, 64);
  ASSERT_EQ(cfg.hc_mult, 4);
  ASSERT_EQ(cfg.compress_ratio[0], 0);
  const dsv4::SeqLayout lay = dsv4::SeqLayout::unpacked(1, 64);
  const int64_t N = 64;
  // Bytes per token, by tensor (bf16 2, fp32 / int32 4).
  const int64_t mhc_site = 24 * 4 + 4 + 4 * 4 + 4 * 4 + 16 * 4;  // mix, rstd, pre, post, comb
  const int64_t keep = 2 * mhc_site                                // the attn and ffn sites
                       + 4 + 64 * 2 + 4 + 64 * 2                   // a_rstd, y_a, u_rstd, y_f
                       + 32 * 2 + 4                                // qa, qa_rstd
                       + 4 * 256 * 2 + 4 * 4                       // q_pre, q_rstd
                       + 256 * 2 + 4                               // kvp, kv_rstd
                       + 4 * 256 * 2 + 4 * 4                       // o, lse
                       + 2 * 16 * 2                                // r (the wo_a output)
                       + 8 * 4 + 8 * 4 + 2 * 4                     // router logits, scores, weights
                       + 2 * 4 + 2 * 4                             // order, slot_pos
                       + 2 * 32 * 2 + 64 * 2                       // shared expert gate|up, output
                       + 2 * 2 * 32 * 2 + 2 * 64 * 2;              // routed experts' gate|up, outputs
  const int64_t keep_fixed = (8 + 1) * 4 + 4;                      // expert offsets, the router's status flag
  const int64_t redo = 64 * 2 + 4 * 64 * 2 + 64 * 2                // a, X_mid, u
                       + 32 * 2 + 4 * 256 * 2 + 256 * 2            // cq, q, kv
                       + 4 * 256 * 2;                              // og
  const int64_t picks = 2 * 4;                                     // the router's selection
  EXPECT_EQ(keep * N + keep_fixed, 402'472);
  EXPECT_EQ(redo * N, 348'160);
  for (dsv4::Recompute r : {dsv4::Recompute::None, dsv4::Recompute::Selective, dsv4::Recompute::Full}) {
    dsv4gpu::ActivationPlanShape s;
    s.layer_begin = 0, s.layer_end = 1, s.recompute = r;
    const dsv4gpu::ActivationPlan p = dsv4gpu::plan_activations(cfg, lay, s);
    ASSERT_EQ(p.blocks.size(), 1u);
    EXPECT_EQ(p.streams, 2 * N * 4 * 64 * 2) << "X(0) and the outgoing X(1), bf16 [N, 4, 64]";
    EXPECT_EQ(p.heads, 0);
    const int64_t all = (keep + redo + picks) * N + keep_fixed;
    switch (r) {
      case dsv4::Recompute::None:
        EXPECT_EQ(p.blocks[0].kept, all);
        EXPECT_EQ(p.blocks[0].dropped, 0);
        break;
      case dsv4::Recompute::Selective:
        EXPECT_EQ(p.blocks[0].kept, (keep + picks) * N + keep_fixed);
        EXPECT_EQ(p.blocks[0].dropped, redo * N);
        break;
      case dsv4::Recompute::Full:
        EXPECT_EQ(p.blocks[0].kept, picks * N);
        EXPECT_EQ(p.blocks[0].dropped, all - picks * N);
        break;
    }
    EXPECT_EQ(p.block_scratch, p.blocks[0].dropped);
    EXPECT_EQ(p.total(), p.kept() + p.block_scratch);
  }
  // The last layer's stage adds the head: bf16 normed [N, d], the collapse's mix [N, 4] and rstd [N], the
  // weights [N, 4], the norm's rstd, the CE's lse, and (a training forward) fp32 d(normed) [N, d].
  dsv4gpu::ActivationPlanShape s;
  s.layer_begin = 2, s.layer_end = 3;
  EXPECT_EQ(dsv4gpu::plan_activations(cfg, lay, s).heads, N * (64 * 2 + 4 * 4 + 4 + 4 * 4 + 4 + 4 + 64 * 4));
}

}  // namespace
