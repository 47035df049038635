// Rank emulation (train/cuda/emulated_rank.h, `trex bench train --emulate-rank`) on the tiny V4, layout
// pp=2 x dp=4 x ep=4 (8 ranks; every expert's optimizer state on one rank: EDP 1): a stage-0 and a stage-1 rank
// each run two steps alone on this GPU with every collective emulated.
//  - it runs: finite loss on the last stage, the rank's own layers and 1/EP of their experts only;
//  - memory: what the model allocates is GpuModel::footprint (which the bench checks before allocating), and that
//    equals the planner's per-rank weights / gradients / optimizer state (src/plan/estimate.h, the same stage
//    layers) up to what the two count differently: the router biases (the planner counts them as weights, the GPU
//    keeps them beside the arena), the fp32 tensors of region R (replicated on every DP rank, the planner shards
//    all dense state over DP) and the arena's alignment padding (at most 512 elements per bucket, 8 per fp32 tensor);
//  - traffic: with balanced routing the expert exchange moves exactly the balanced bytes: per MoE layer and
//    micro-batch, the per-expert counts (E/EP int32 to each peer) and four row exchanges (dispatch, combine, and
//    both again in the backward) of N K / EP rows of d bf16 to each of the EP - 1 peers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "comm/two_rank_threads.h"
#include "model/cuda/gpu_impl.h"
#include "model/dsv4/param_table.h"
#include "model/dsv4/partition.h"
#include "parallel/rank_partition.h"
#include "plan/estimate.h"
#include "plan/model_spec.h"
#include "plan/profiles.h"
#include "train/cuda/emulated_rank.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kSeq = 64, kGlobalBatch = 8;  // 2 micro-batches of one sequence per DP rank

TEST(EmulatedRankGpu, RunsAndAllocatesWhatThePlannerCounts) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("emulated rank test");
  const parallel::MeshSpec spec = parallel::parse_mesh_spec("pp=2,dp=4,ep=4");
  const int D = spec.dp, EP = spec.ep;
  const int64_t E = cfg.n_routed_experts, K = cfg.topk, d = cfg.hidden;

  // The planner on the same model, workload and stage layers.
  plan::Workload w;
  w.seq = kSeq, w.gbs = kGlobalBatch, w.frozen_router = false, w.mtp = false;
  plan::Estimator est(plan::parse_model_spec(trex::testing::tiny_gpu_config_json(), "tiny"),
                      plan::load_hardware("nvidia-h200"), plan::load_impl("trex-prior"), w);
  std::vector<std::vector<int64_t>> chunks;
  for (const dsv4::ModelPartition& part : dsv4::split_layers(cfg, spec.pp)) {
    chunks.emplace_back();
    for (int64_t l = part.layer_begin; l < part.layer_end; ++l) chunks.back().push_back(l);
  }
  est.set_partition(spec.pp, 1, chunks);
  plan::Layout l;
  l.pp = spec.pp, l.dp = D, l.ep = EP, l.mbs = 1, l.zero = 1;
  const plan::Estimate e = est.estimate(l, spec.pp * D);
  ASSERT_TRUE(e.valid) << e.reason;
  ASSERT_EQ(e.stage_mem.size(), 2u);

  for (int rank : {1, 6}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const parallel::RankPartition p = parallel::rank_partition(spec, rank, cfg, kGlobalBatch);
    parallel::EmulatedMesh sizing = parallel::make_emulated_mesh(p);
    const dsv4gpu::GpuModel::Footprint fp =
        dsv4gpu::GpuModel::footprint(cfg, train::EmulatedRank::model_options(p, sizing, {}));
    train::EmulatedRank r(cfg, p, kSeq, {}, 3);
    cuda::AdamWStep a;
    a.lr = 1e-4;
    double loss = 0;
    for (int s = 1; s <= 2; ++s) {
      a.step = s;
      loss = r.step(a);
    }
    TREX_CUDA(cudaDeviceSynchronize());
    if (p.head) {
      EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
    } else {
      EXPECT_EQ(loss, 0.0);
    }
    // What was allocated is the footprint.
    const dsv4gpu::GpuModel::Impl& m = r.model().impl();
    EXPECT_EQ(int64_t(m.compute.bytes()), fp.compute_bytes());
    EXPECT_EQ(int64_t(m.grads.bytes()), fp.grad_bytes());
    EXPECT_EQ(int64_t(m.master.bytes()), fp.master_bytes());
    EXPECT_EQ(r.model().n_params(), fp.n_params);
    // Its own layers and experts only.
    for (const std::string& n : r.model().param_names()) {
      const size_t at = n.find("layers.");
      if (at == 0) {
        const int64_t layer = std::stoll(n.substr(7));
        EXPECT_TRUE(layer >= p.layer_begin && layer < p.layer_end) << n;
      }
      const size_t ex = n.find(".ffn.experts.");
      if (ex != std::string::npos) {
        const int64_t x = std::stoll(n.substr(ex + 13));
        EXPECT_TRUE(x >= p.expert_begin && x < p.expert_end) << n;
      }
    }

    // Against the planner's numbers for this stage.
    int64_t bias = 0, region_r = 0, r_tensors = 0;
    for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) {
      const bool mine = (s.part == dsv4::ParamPart::Layer && s.layer >= p.layer_begin && s.layer < p.layer_end) ||
                        (s.part == dsv4::ParamPart::Head && p.head) || (s.part == dsv4::ParamPart::Embed && p.embed);
      if (!mine) continue;
      if (s.kind == dsv4::ParamKind::RouterBias) bias += numel(s.shape);
      if (s.trained() && s.dtype == DType::F32) region_r += numel(s.shape), ++r_tensors;
    }
    const int64_t buckets = (p.layer_end - p.layer_begin) + 2;  // the layers', the embedding's and the head's
    const double pad = double(512 * (buckets + 1) + 8 * r_tensors);  // elements; +1: region X's alignment
    const plan::MemoryBreakdown& pm = e.stage_mem[size_t(p.pp_rank)];
    const double want_bf16 = pm.weights * kGiB - 2.0 * double(bias);
    const double want_grads = pm.grads * kGiB - 4.0 * double(bias);
    const double want_opt = pm.optimizer * kGiB - 12.0 * double(bias) / D + 12.0 * double(region_r) * (1.0 - 1.0 / D);
    const double gpu_opt = double(fp.master_bytes() + fp.adamw_bytes());
    std::printf("rank %d (stage %d): bf16 weights %.0f B (planner %.0f), grads %.0f (%.0f), optimizer %.0f (%.0f); "
                "slack %.0f elements\n",
                rank, p.pp_rank, double(fp.compute_bytes()), want_bf16, double(fp.grad_bytes()), want_grads,
                gpu_opt, want_opt, pad);
    EXPECT_GE(double(fp.compute_bytes()), want_bf16 - 1);
    EXPECT_LE(double(fp.compute_bytes()), want_bf16 + 2 * pad);
    EXPECT_GE(double(fp.grad_bytes()), want_grads - 1);
    EXPECT_LE(double(fp.grad_bytes()), want_grads + 4 * pad);
    EXPECT_NEAR(gpu_opt, want_opt, 12 * pad);

    // The expert exchange at the balanced sizes.
    const auto stats = r.comm_stats();
    ASSERT_TRUE(stats.count("ep") && stats.at("ep").count("all_to_all_v"));
    const int64_t moe_layers = p.layer_end - p.layer_begin, micro = 2 * p.micro_batches;  // 2 steps
    const int64_t rows = kSeq * K / EP;  // per peer
    const int64_t per = (EP - 1) * (E / EP) * 4 + 4 * (EP - 1) * rows * d * 2;
    EXPECT_EQ(stats.at("ep").at("all_to_all_v").bytes, micro * moe_layers * per);
    EXPECT_EQ(stats.at("ep").at("all_to_all_v").calls, micro * moe_layers * 5);
    // The pipeline boundary: one bf16 [N, hc, d] stream per micro-batch out of stage 0, one fp32 gradient back in.
    const int64_t stream = kSeq * cfg.hc_mult * d;
    if (p.pp_rank == 0) {
      EXPECT_EQ(stats.at("pp.act").at("send").bytes, micro * stream * 2 + 16);  // + the connection handshake
      EXPECT_EQ(stats.at("pp.grad").at("recv").bytes, micro * stream * 4 + 16);
    }
    // The planner's per-step communication of this stage (plan/comm_volume.h) counts the same bytes and calls as
    // the emulated groups, two steps of them: the expert exchange, the ZeRO-1 reduce-scatter of the stage's
    // buckets and the post-step weight all-gather.
    const plan::RankComm& pc = e.stage_comm[size_t(p.pp_rank)];
    const auto& ep_a2a = stats.at("ep").at("all_to_all_v");
    EXPECT_NEAR(double(ep_a2a.bytes), 2 * pc.bytes("all_to_all_v"), 1e-6 * double(ep_a2a.bytes));
    EXPECT_EQ(ep_a2a.calls, 2 * pc.calls("all_to_all_v"));
    ASSERT_TRUE(stats.count("dp"));
    for (const char* op : {"reduce_scatter", "all_gather"}) {
      SCOPED_TRACE(op);
      ASSERT_TRUE(stats.at("dp").count(op));
      double bytes = 0;
      int64_t calls = 0;
      for (const plan::CommKind& k : pc.kinds)
        if (k.dim == "dp" && k.op == op) bytes += k.bytes, calls += k.calls;
      EXPECT_NEAR(double(stats.at("dp").at(op).bytes), 2 * bytes, 1e-6 * bytes);
      EXPECT_EQ(stats.at("dp").at(op).calls, 2 * calls);
    }
  }
}

}  // namespace

namespace {

using namespace trex;

// The tiny V4 with `layers` layers cycling sliding / CSA / HCA (the CSA layers' indexer top-k runs).
dsv4::ModelConfig tiny_with_layers(int64_t layers) {
  nlohmann::json j = trex::testing::tiny_gpu_config_json();
  j["num_hidden_layers"] = layers;
  j["compress_ratios"] = nlohmann::json::array();
  for (int64_t l = 0; l < layers; ++l) j["compress_ratios"].push_back(std::vector<int>{0, 4, 16}[size_t(l % 3)]);
  return dsv4::parse_model_config(j, "emulated last stage test");
}

// The last stage of a deep model: the boundary it receives is the emulated group's fixed random stream, so its
// activations and gradients are those of real values. With the loop-back's zeros every RMS norm of the stage saw
// a zero row (rstd = 1 / sqrt(eps)), the backward grew by that factor per norm and overflowed to inf / NaN, the
// optimizer step wrote NaN weights, and the next step's CSA indexer top-k (NaN scores) selected entries outside
// the keys: the illegal memory access of the released configs' last stages (V4-Flash pp=4: 10 layers).
TEST(EmulatedRankGpu, LastStageOfADeepModelStaysFinite) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const dsv4::ModelConfig cfg = tiny_with_layers(12);
  const parallel::MeshSpec spec = parallel::parse_mesh_spec("pp=2,dp=2,ep=2");
  const int rank = 3;  // stage 1: layers [6, 12) and the head
  const parallel::RankPartition p = parallel::rank_partition(spec, rank, cfg, kGlobalBatch);
  ASSERT_TRUE(p.head);
  ASSERT_EQ(p.layer_end - p.layer_begin, 6);
  train::EmulatedRank r(cfg, p, kSeq, {}, 5);
  cuda::AdamWStep a;
  a.lr = 1e-3;
  for (int s = 1; s <= 3; ++s) {
    a.step = s;
    const double loss = r.step(a);
    TREX_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(std::isfinite(loss) && loss > 0) << "step " << s << ": loss " << loss;
    const double gn = r.model().dp_grad_norm();
    EXPECT_TRUE(std::isfinite(gn) && gn > 0) << "step " << s << ": gradient norm " << gn;
  }
  // The weights after the updates are finite.
  int64_t checked = 0;
  for (const std::string& n : r.model().param_names()) {
    for (float v : r.model().value(n)) ASSERT_TRUE(std::isfinite(v)) << n;
    ++checked;
  }
  EXPECT_GT(checked, 6 * 10);
}

}  // namespace

namespace {
// ZeRO-2 emulated (`trex bench train --emulate-rank R --zero 2`, fp32 and bf16 reduction): the rank runs two
// finite steps; its persistent gradients are the footprint's, which is the ZeRO-1 footprint's region X (its
// experts) and region R plus 1/DP of the bucket elements; the dense reduce-scatter moves the same bytes as ZeRO-1's
// (every bucket of every micro-batch: ZeRO-2 reduces in each backward, ZeRO-1 in the step's last one only).
TEST(EmulatedRankGpu, ZeroTwoShardsTheRanksGradients) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("emulated rank zero 2");
  const parallel::MeshSpec spec = parallel::parse_mesh_spec("pp=2,dp=4,ep=4");
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 reduction" : "fp32 reduction");
    const parallel::RankPartition p = parallel::rank_partition(spec, 6, cfg, kGlobalBatch);  // the head stage
    dsv4gpu::GpuModelOptions z1, z2;
    z2.zero = 2, z2.grad_reduce_bf16 = bf16;
    parallel::EmulatedMesh sizing = parallel::make_emulated_mesh(p);
    const auto f1 = dsv4gpu::GpuModel::footprint(cfg, train::EmulatedRank::model_options(p, sizing, z1));
    const auto f2 = dsv4gpu::GpuModel::footprint(cfg, train::EmulatedRank::model_options(p, sizing, z2));
    EXPECT_LT(f2.grad_bytes(), f1.grad_bytes());
    EXPECT_EQ(f2.compute_bytes(), f1.compute_bytes());
    EXPECT_EQ(f2.master_bytes(), f1.master_bytes());
    EXPECT_GT(f2.grad_buffer_bytes, 0);
    train::EmulatedRank r(cfg, p, kSeq, z2, 3);
    cuda::AdamWStep a;
    a.lr = 1e-4;
    double loss = 0;
    for (int s = 1; s <= 2; ++s) {
      a.step = s;
      loss = r.step(a);
    }
    TREX_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
    const dsv4gpu::GpuModel::Impl& m = r.model().impl();
    EXPECT_EQ(int64_t(m.grads.bytes()), f2.grad_bytes());
    // region X whole + the buckets' 1/DP + region R
    EXPECT_EQ(f2.grad_elems, m.region_x + (m.region_a - m.region_x) / spec.dp + (m.total - m.region_a));
    const auto stats = r.comm_stats();
    ASSERT_TRUE(stats.count("dp") && stats.at("dp").count("reduce_scatter"));
    // Two steps of 2 micro-batches: every bucket of this stage (its layers', the head's) reduced per backward.
    int64_t bucket_bytes = 0;
    for (const auto& b : m.buckets) bucket_bytes += (b.end - b.begin) * (bf16 ? 2 : 4);
    EXPECT_EQ(stats.at("dp").at("reduce_scatter").bytes, 2 * p.micro_batches * bucket_bytes);
  }
}
}  // namespace

namespace {
// Interleaved stages emulated (`--layout pp=2,vpp=2,...`) with the MTP module on: 8 layers in 4 virtual stages of 2,
// rank 0 holds virtual stages 0 and 2 (embedding on the first), rank 2 (stage 1) virtual stages 1 and 3 (the head
// and the MTP module with its tied copy of embed.weight on the last). Each chunk is its own GpuModel with its own
// layers only and the slots the interleaved schedule needs; both ranks run two finite steps; the wrap-around link
// (the last rank's chunk 0 -> rank 0's chunk 1, and the gradients back) carries one boundary tensor per micro-batch;
// the tied embedding's gradient sum runs once a step on both ends.
TEST(EmulatedRankGpu, InterleavedChunksWithTheMtpModule) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  nlohmann::json j = trex::testing::tiny_gpu_config_json(1);
  j["num_hidden_layers"] = 8;
  j["compress_ratios"] = nlohmann::json::array();
  for (int l = 0; l < 9; ++l) j["compress_ratios"].push_back(std::vector<int>{0, 4, 16, 0}[size_t(l % 4)]);
  const dsv4::ModelConfig cfg = dsv4::parse_model_config(j, "emulated vpp test");
  const parallel::MeshSpec spec = parallel::parse_mesh_spec("pp=2,vpp=2,dp=2,ep=2");
  const int64_t micro = 4;  // 8 sequences over dp=2, one per micro-batch: a multiple of pp
  const int64_t stream = kSeq * cfg.hc_mult * cfg.hidden;
  for (int rank : {0, 2}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const parallel::RankPartition p = parallel::rank_partition(spec, rank, cfg, kGlobalBatch);
    ASSERT_EQ(p.micro_batches, micro);
    ASSERT_EQ(p.chunks.size(), 2u);
    train::EmulatedRank r(cfg, p, kSeq, {}, 7);
    ASSERT_EQ(r.chunks(), 2);
    int64_t params = 0;
    for (int c = 0; c < 2; ++c) {
      const parallel::RankChunk& k = p.chunks[size_t(c)];
      const dsv4gpu::GpuModel::Impl& m = r.model(c).impl();
      EXPECT_EQ(m.l0, k.layer_begin);
      EXPECT_EQ(m.l1, k.layer_end);
      EXPECT_EQ(int(m.slots.size()), k.slots);
      EXPECT_EQ(m.mtp(), k.head);  // the MTP module on the last virtual stage only
      bool embed = false;
      for (const std::string& n : r.model(c).param_names()) {
        if (n == "embed.weight") embed = true;
        if (n.rfind("layers.", 0) == 0) {
          const int64_t layer = std::stoll(n.substr(7));
          EXPECT_TRUE(layer >= k.layer_begin && layer < k.layer_end) << n;
        }
      }
      EXPECT_EQ(embed, k.embed || k.head) << "chunk " << c;  // the head's copy for the MTP input
      params += r.model(c).n_params();
    }
    EXPECT_EQ(r.n_params(), params);
    cuda::AdamWStep a;
    a.lr = 1e-4;
    double loss = 0;
    for (int s = 1; s <= 2; ++s) {
      a.step = s;
      loss = r.step(a);
    }
    TREX_CUDA(cudaDeviceSynchronize());
    if (p.head) {
      EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
    } else {
      EXPECT_EQ(loss, 0.0);
    }
    for (int c = 0; c < 2; ++c)
      for (const std::string& n : r.model(c).param_names())
        for (float v : r.model(c).value(n)) ASSERT_TRUE(std::isfinite(v)) << n;
    const auto stats = r.comm_stats();
    // Two steps of 4 micro-batches; + the connection handshake (16 bytes) of each direction.
    if (rank == 2) {  // the last rank: its chunk 0's output wraps to rank 0's chunk 1
      ASSERT_TRUE(stats.count("pp.act_wrap") && stats.count("pp.grad_wrap"));
      EXPECT_EQ(stats.at("pp.act_wrap").at("send").bytes, 2 * micro * stream * 2 + 16);
      EXPECT_EQ(stats.at("pp.grad_wrap").at("recv").bytes, 2 * micro * stream * 4 + 16);
    } else {
      EXPECT_EQ(stats.at("pp.act_wrap").at("recv").bytes, 2 * micro * stream * 2 + 16);
      EXPECT_EQ(stats.at("pp.grad_wrap").at("send").bytes, 2 * micro * stream * 4 + 16);
    }
    ASSERT_TRUE(stats.count("embed") && stats.at("embed").count("all_reduce"));
    EXPECT_EQ(stats.at("embed").at("all_reduce").calls, 2);
    EXPECT_GT(r.pipeline_buffer_bytes(), 0);
    EXPECT_NE(r.memory_report().find("weights (bf16)"), std::string::npos);
  }
}
}  // namespace
