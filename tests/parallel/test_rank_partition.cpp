// One rank's share of a pp x dp x ep layout without the other ranks (parallel/rank_partition.h): parsed from the
// `--layout` text, against the mesh's rank order and dsv4::split_layers, for the tiny test config and the released
// V4-Flash config; the refusals name the rule and the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/config.h"
#include "model/dsv4/partition.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/rank_partition.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using parallel::parse_mesh_spec;
using parallel::rank_partition;

// The tiny config with another expert count / layer count (compress ratios cycling sliding, CSA, HCA).
dsv4::ModelConfig tiny_with(int64_t experts, int64_t layers = 3) {
  nlohmann::json j = trex::testing::tiny_gpu_config_json();
  j["n_routed_experts"] = experts;
  j["num_hidden_layers"] = layers;
  j["compress_ratios"] = nlohmann::json::array();
  for (int64_t l = 0; l < layers; ++l) j["compress_ratios"].push_back(std::vector<int>{0, 4, 16}[size_t(l % 3)]);
  return dsv4::parse_model_config(j, "rank partition test");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const trex::Error& e) {
    return e.what();
  }
  return "";
}

TEST(RankPartition, CoordinatesLayersExpertsAndSlots) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("rank partition test");  // 3 layers, 8 experts
  const parallel::MeshSpec s = parse_mesh_spec("pp=2,dp=4,ep=2");
  // Rank 6: stage 1 (ranks 4..7), dp rank 2, ep rank 0, edp rank 1 of 2.
  const parallel::RankPartition p = rank_partition(s, 6, cfg, /*global_batch=*/16);
  EXPECT_EQ(p.world_size, 8);
  EXPECT_EQ(p.pp_rank, 1);
  EXPECT_EQ(p.dp_rank, 2);
  EXPECT_EQ(p.ep_rank, 0);
  EXPECT_EQ(p.edp_rank, 1);
  EXPECT_EQ(p.edp_size, 2);
  const auto parts = dsv4::split_layers(cfg, 2);
  EXPECT_EQ(p.layer_begin, parts[1].layer_begin);
  EXPECT_EQ(p.layer_end, 3);
  EXPECT_FALSE(p.embed);
  EXPECT_TRUE(p.head);
  EXPECT_EQ(p.expert_begin, 0);
  EXPECT_EQ(p.expert_end, 4);
  EXPECT_EQ(p.micro_batches, 4);  // 16 sequences over 4 DP ranks, one per micro-batch
  EXPECT_EQ(p.stage_slots, 1);    // the last stage
  const parallel::RankPartition q = rank_partition(s, 1, cfg, 16);
  EXPECT_EQ(q.pp_rank, 0);
  EXPECT_TRUE(q.embed);
  EXPECT_EQ(q.expert_begin, 4);  // ep rank 1
  EXPECT_EQ(q.stage_slots, 2);
  EXPECT_EQ(q.in_flight, 2);
  // Fewer micro-batches than stages in flight: the stage holds only those.
  EXPECT_EQ(rank_partition(s, 1, cfg, 4).in_flight, 1);
  EXPECT_NE(p.describe().find("layers [2, 3)"), std::string::npos) << p.describe();

  const parallel::EmulatedMesh m = parallel::make_emulated_mesh(p);
  ASSERT_TRUE(m.dp && m.ep && m.act && m.grad);
  EXPECT_EQ(m.dp->rank(), 2);
  EXPECT_EQ(m.dp->size(), 4);
  EXPECT_EQ(m.ep->rank(), 0);
  EXPECT_EQ(m.ep->size(), 2);
  EXPECT_EQ(m.act->rank(), 1);
  auto edp = m.dp->split(p.ep_rank, p.dp_rank);  // as the GPU model asks for its expert-data-parallel group
  EXPECT_EQ(edp->size(), p.edp_size);
  EXPECT_EQ(edp->rank(), p.edp_rank);
  const parallel::EmulatedMesh one = parallel::make_emulated_mesh(rank_partition(parse_mesh_spec("pp=1"), 0, cfg, 1));
  EXPECT_FALSE(one.dp || one.ep || one.act || one.grad);
}

// Tensor parallelism: TP innermost (mesh.h), so world rank 13 of pp=2 x dp=4 (ep=2) x tp=2 is TP rank 1 of DP rank 2
// of stage 1, with that DP rank's experts and micro-batches; its emulated TP group has the TP degree.
TEST(RankPartition, TensorParallelRanksAreInnermost) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("rank partition test");  // 4 heads, 2 groups
  const parallel::MeshSpec s = parse_mesh_spec("pp=2,dp=4,ep=2,tp=2");
  const parallel::RankPartition p = rank_partition(s, 13, cfg, 16);
  EXPECT_EQ(p.world_size, 16);
  EXPECT_EQ(p.tp_rank, 1);
  EXPECT_EQ(p.pp_rank, 1);
  EXPECT_EQ(p.dp_rank, 2);
  EXPECT_EQ(p.ep_rank, 0);
  EXPECT_EQ(p.micro_batches, 4);
  const parallel::RankPartition q = rank_partition(s, 12, cfg, 16);  // its TP peer: the same share
  EXPECT_EQ(q.tp_rank, 0);
  EXPECT_EQ(q.dp_rank, p.dp_rank);
  EXPECT_EQ(q.expert_begin, p.expert_begin);
  EXPECT_EQ(q.layer_begin, p.layer_begin);
  const parallel::EmulatedMesh m = parallel::make_emulated_mesh(p);
  ASSERT_TRUE(m.tp);
  EXPECT_EQ(m.tp->rank(), 1);
  EXPECT_EQ(m.tp->size(), 2);
  EXPECT_NE(p.describe().find("tp=2"), std::string::npos) << p.describe();
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("tp=3"), 0, cfg, 8); }).find("4 attention query heads"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("tp=4"), 0, cfg, 8); }).find("2 output-projection"),
            std::string::npos);
  EXPECT_FALSE(parallel::make_emulated_mesh(rank_partition(parse_mesh_spec("dp=2"), 0, cfg, 2)).tp);
}

TEST(RankPartition, RefusalsNameTheRule) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("rank partition test");
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("pp=2,dp=4,ep=3"), 0, cfg, 8); })
                .find("does not divide dp=4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("dp=4,ep=4"), 0, tiny_with(6), 8); })
                .find("6 routed experts"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("pp=4"), 0, cfg, 8); }).find("for only 3 layers"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("pp=2,dp=2"), 4, cfg, 8); }).find("outside the layout's 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("pp=1,dp=4"), 0, cfg, 6); }).find("global batch 6"),
            std::string::npos);
  // Interleaved: the schedule needs M a multiple of pp (8 sequences over dp=4: 2 micro-batches on pp=4).
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("pp=4,vpp=2,dp=4"), 0, tiny_with(8, 8), 12); })
                .find("micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of([&] { rank_partition(parse_mesh_spec("pp=2,vpp=3"), 0, tiny_with(8, 4), 8); })
                .find("for only 4 layers"),
            std::string::npos);
  EXPECT_THROW(parse_mesh_spec("pp=2,cp=2"), trex::Error);  // context parallelism: not a mesh dimension
}

// V4-Flash (43 layers, 256 experts) on 128 ranks as pp=4 x dp=32 x ep=32: 11 + 11 + 11 + 10 layers (split_layers:
// the larger chunks first), 8 experts per rank.
TEST(RankPartition, ReleasedFlashConfig) {
  const auto path = trex::shared_dir() / "bench" / "v4-flash.json";
  if (!trex::fs::exists(path)) GTEST_SKIP() << path << " not found";
  const dsv4::ModelConfig cfg = dsv4::load_model_config(path.string());
  const parallel::MeshSpec s = parse_mesh_spec("pp=4,dp=32,ep=32");
  int64_t layers = 0;
  for (int st = 0; st < 4; ++st) {
    const parallel::RankPartition p = rank_partition(s, st * 32 + 5, cfg, 128);
    EXPECT_EQ(p.layer_end - p.layer_begin, st < 3 ? 11 : 10) << "stage " << st;
    EXPECT_EQ(p.layer_begin, layers);
    layers = p.layer_end;
    EXPECT_EQ(p.expert_end - p.expert_begin, 8);
    EXPECT_EQ(p.expert_begin, 5 * 8);
    EXPECT_EQ(p.micro_batches, 4);
    EXPECT_EQ(p.stage_slots, 4 - st);
  }
  EXPECT_EQ(layers, 43);
}

// Interleaved stages (vpp 2) on 8 layers, pp=2: rank r holds virtual stages r and r + 2 (split_layers over 4
// chunks: 2 layers each), the first rank embeds and the last holds the head; each chunk's slots are the most
// micro-batches the interleaved schedule keeps live on it, and the rank's in-flight count sums them. The MTP
// module goes with the head, and with pp > 1 the first and the last stage hold the tied embedding.
TEST(RankPartition, InterleavedChunksAndTheirSlots) {
  nlohmann::json j = trex::testing::tiny_gpu_config_json(1);
  j["num_hidden_layers"] = 8;
  j["compress_ratios"] = nlohmann::json::array();
  for (int l = 0; l < 9; ++l) j["compress_ratios"].push_back(std::vector<int>{0, 4, 16, 0}[size_t(l % 4)]);  // MTP: sliding
  const dsv4::ModelConfig cfg = dsv4::parse_model_config(j, "rank partition vpp test");
  const parallel::MeshSpec s = parse_mesh_spec("pp=2,vpp=2,dp=2,ep=2");
  const parallel::RankPartition p0 = rank_partition(s, 0, cfg, 8), p1 = rank_partition(s, 2, cfg, 8);
  ASSERT_EQ(p0.chunks.size(), 2u);
  ASSERT_EQ(p1.chunks.size(), 2u);
  EXPECT_EQ(p0.micro_batches, 4);
  EXPECT_EQ(p0.chunks[0].virtual_stage, 0);
  EXPECT_EQ(p0.chunks[1].virtual_stage, 2);
  EXPECT_EQ(p1.chunks[1].virtual_stage, 3);
  EXPECT_EQ(p0.chunks[1].layer_begin, 4);
  EXPECT_EQ(p0.chunks[1].layer_end, 6);
  EXPECT_EQ(p1.chunks[0].layer_begin, 2);
  EXPECT_EQ(p1.chunks[1].layer_end, 8);
  EXPECT_TRUE(p0.embed && !p0.head && !p0.mtp);
  EXPECT_TRUE(p1.head && !p1.embed && p1.mtp);
  EXPECT_TRUE(p0.tied_embedding && p1.tied_embedding);
  EXPECT_EQ(p0.layers(), 4);
  // The schedule's live micro-batches per chunk: independent of the GPU code, by walking make_schedule here.
  for (const parallel::RankPartition* p : {&p0, &p1}) {
    parallel::ScheduleSpec ss;
    ss.pp = 2, ss.vpp = 2, ss.micro_batches = 4, ss.kind = parallel::ScheduleKind::Interleaved;
    const parallel::Schedule sch = parallel::make_schedule(ss);
    int live[2] = {0, 0}, most[2] = {0, 0};
    int64_t fwd = 0, bwd = 0;
    for (const parallel::PipeAction& a : sch.ranks[size_t(p->pp_rank)]) {
      if (a.op == parallel::PipeOp::Forward) most[a.chunk] = std::max(most[a.chunk], ++live[a.chunk]), ++fwd;
      if (a.op == parallel::PipeOp::Backward) --live[a.chunk], ++bwd;
    }
    EXPECT_EQ(fwd, 8);  // every micro-batch through both chunks
    EXPECT_EQ(bwd, 8);
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(p->chunks[size_t(c)].slots, most[c]) << "rank " << p->pp_rank << " chunk " << c;
      EXPECT_GE(most[c], 1);
      EXPECT_LE(most[c], 4);
    }
    EXPECT_EQ(p->in_flight, most[0] + most[1]);
  }
  // The earlier rank holds more in flight (its first chunk's warm-up is the longest).
  EXPECT_GE(p0.in_flight, p1.in_flight);
  EXPECT_NE(p0.describe().find("virtual stage 2 [4, 6)"), std::string::npos) << p0.describe();
  const parallel::EmulatedMesh m0 = parallel::make_emulated_mesh(p0), m1 = parallel::make_emulated_mesh(p1);
  ASSERT_TRUE(m0.act_wrap && m0.grad_wrap && m0.embed && m1.embed);
  EXPECT_EQ(m0.act_wrap->size(), 2);
  EXPECT_EQ(m0.embed->rank(), 0);
  EXPECT_EQ(m1.embed->rank(), 1);
  EXPECT_EQ(m0.all().size(), 7u);  // dp, ep, act, grad, the two wrap groups, embed (no tp)
  // Without MTP no embedding group; one stage never has one.
  EXPECT_FALSE(parallel::make_emulated_mesh(rank_partition(s, 0, tiny_with(8, 8), 8)).embed);
  EXPECT_FALSE(parallel::make_emulated_mesh(rank_partition(parse_mesh_spec("dp=2"), 0, cfg, 2)).embed);
}

}  // namespace
