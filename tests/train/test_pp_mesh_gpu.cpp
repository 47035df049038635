// Pipeline stages combined with data and expert parallelism on the GPU (pp x dp x ep, EP folded into DP), every
// rank a thread of this process on ONE GPU over thread-group communicators (comm/thread_group.h): world rank
// = stage * D + dp_rank, each stage's D ranks one DP group (and EP groups of `ep` consecutive DP ranks), each
// DP index's P ranks one pipeline (two groups: activations, gradients), as parallel/mesh.h lays them out.
//
// PpMeshGpu.MatchesOneRankOnTheGlobalBatch/{pp2_dp2, pp2_dp4_ep2}: 2 steps of the 1F1B pipeline (M = 4
// micro-batches per DP rank) with an AdamW step between, against one rank accumulating the global batch's D * M
// micro-batches (same micro-batch shape, same kernels) under begin_step. Every step's loss (the last stage's
// shares summed over DP) within bf16 noise; after step 1 every gradient by name: dense ones reduced over DP
// (add_reduced_grads_to + gather_shard), experts reduce-scattered over their expert-data-parallel replicas (the
// same add_reduced_grads_to + gather_shard over the replicas), each expert present on its owners only. Memory: each rank holds only its stage's
// tensors and 1/EP of their experts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gpu_test_util.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "comm/two_rank_threads.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/param_table.h"
#include "model/dsv4/partition.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_pipeline.h"
#include "train/gpu_mesh_test_support.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using Grads = std::map<std::string, std::vector<float>>;

constexpr int64_t kS = 64, kM = 4;  // tokens per micro-batch, micro-batches per DP rank
constexpr int kSteps = 2;

struct Layout {
  int pp, dp, ep;
  const char* name;
};

using trex::gpu_test::rel_l2;

// The global batch: D * M micro-batches of one 64-token sequence; DP rank d runs micro-batches [d M, (d+1) M).
void make_batch(int64_t V, int D, std::vector<int32_t>& ids, std::vector<int32_t>& labels) {
  trex::testing::make_global_batch(V, D * kM, kS, 23, ids, labels);
}

using trex::testing::is_expert_tensor;
constexpr auto adamw = trex::testing::pipeline_adamw;

class PpMeshGpu : public ::testing::TestWithParam<Layout> {};

TEST_P(PpMeshGpu, MatchesOneRankOnTheGlobalBatch) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const Layout L = GetParam();
  const int P = L.pp, D = L.dp, EP = L.ep, N = P * D;
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("pp mesh test config");
  const int64_t E = cfg.n_routed_experts;
  ASSERT_EQ(E % EP, 0);
  std::vector<int32_t> ids, labels;
  make_batch(cfg.vocab_size, D, ids, labels);
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(1, kS);

  // One rank: the global batch's micro-batches in order, accumulated under one begin_step.
  const trex::testing::OneRankReference ref = trex::testing::one_rank_reference(cfg, ids, labels, D * kM, kS, kSteps);
  const std::vector<double>& ref_losses = ref.losses;
  const Grads& ref_grads = ref.grads;
  const int64_t full_params = ref.n_params;

  // The mesh's groups, each its own thread group.
  const trex::testing::PipelineMeshGroups groups(P, D, EP, 2);
  const std::vector<dsv4::ModelPartition> parts = dsv4::split_layers(cfg, P);
  struct RankOut {
    std::vector<double> losses;
    Grads dense, expert;  // dense: reduced over DP (every rank of the stage); expert: reduced over its replicas
    int64_t n_params = 0;
  };
  std::vector<RankOut> out(static_cast<size_t>(N));
  trex::testing::run_ranks(N, [&](int w) {
    const int s = w / D, d = w % D;
    dsv4gpu::GpuModelOptions o;
    o.layer_begin = parts[size_t(s)].layer_begin, o.layer_end = parts[size_t(s)].layer_end;
    o.stage_slots = P - s;
    o.dp = groups.dp(s, d);
    o.ep = groups.ep(s, d);
    dsv4gpu::GpuModel m(cfg, o);
    dsv4gpu::GpuOptimizer opt(m);
    m.init_random(5);
    RankOut& r = out[size_t(w)];
    r.n_params = m.n_params();
    dsv4gpu::GpuPipeline pipe(m, groups.direction(0, s, d), groups.direction(1, s, d), kM);
    const int64_t off = d * kM * kS;
    std::vector<double> local;
    dsv4gpu::DevMem acc(size_t(m.shard_elems()) * sizeof(float));
    for (int step = 1; step <= kSteps; ++step) {
      m.zero_grads();
      local.push_back(pipe.step(ids.data() + off, labels.data() + off, mb));
      if (step == 1) {
        TREX_CUDA(cudaMemset(acc.as<float>(), 0, size_t(m.shard_elems()) * sizeof(float)));
        m.add_reduced_grads_to(acc.as<float>());
        for (const std::string& n : m.param_names()) {  // the same dense names on every rank of the stage
          // Region X: complete on the owner, reduce-scattered over its EDP replicas (gathered over them here).
          (EP > 1 && is_expert_tensor(n) ? r.expert : r.dense)[n] = m.gather_shard(n, acc.as<float>());
        }
      }
      opt.adamw_step(adamw(step));
    }
    r.losses = pipe.global_losses(local);  // this DP rank's share of each step, from the last stage
  });
  if (HasFailure()) return;

  // Losses: the DP shares (each pipeline's) summed.
  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    for (int d = 0; d < D; ++d) loss += out[size_t(d)].losses[size_t(step)];  // stage 0's copy of pipeline d's
    for (int d = 0; d < D; ++d)
      EXPECT_EQ(out[size_t(d)].losses[size_t(step)], out[size_t((P - 1) * D + d)].losses[size_t(step)])
          << "pipeline " << d << ": the stages report different losses";
    std::printf("%s step %d: loss one rank %.6f, pipeline x DP %.6f\n", L.name, step + 1, ref_losses[size_t(step)],
                loss);
    const double tol = (step == 0 ? 2e-3 : 5e-3) * std::abs(ref_losses[size_t(step)]);
    EXPECT_NEAR(loss, ref_losses[size_t(step)], tol) << "step " << step + 1;
  }

  // Memory: the stages' dense tensors and 1/EP of their experts: a stage's EP ranks together hold its dense
  // tensors once each and its experts once.
  int64_t expert_elems = 0;
  for (const dsv4::ParamSpec& sp : dsv4::param_table(cfg))
    if (sp.trained() && sp.expert >= 0) expert_elems += numel(sp.shape);
  int64_t held = 0;
  for (int s = 0; s < P; ++s)
    for (int k = 0; k < EP; ++k) held += out[size_t(s * D + k)].n_params;
  EXPECT_EQ(held, full_params + (EP - 1) * (full_params - expert_elems));
  for (int w = 0; w < N; ++w) EXPECT_LT(out[size_t(w)].n_params, full_params) << "rank " << w;

  // Gradients by name. Without EP the experts are dense tensors (DP-bucketed, reduce-scattered).
  auto sharded = [EP](const std::string& n) { return EP > 1 && is_expert_tensor(n); };
  double worst[2] = {0, 0};
  std::string worst_name[2];
  for (const auto& [name, g_ref] : ref_grads) {
    std::vector<float> g(g_ref.size(), 0.f);
    int holders = 0;
    for (int w = 0; w < N; ++w) {
      const RankOut& r = out[size_t(w)];
      const Grads& mine = sharded(name) ? r.expert : r.dense;
      auto it = mine.find(name);
      if (it == mine.end()) continue;
      if (++holders == 1) g = it->second;
      EXPECT_EQ(it->second, g) << name << ": the ranks holding it disagree on the reduced gradient";
    }
    const int want = sharded(name) ? D / EP : D;  // one stage: its DP ranks, or the expert's EDP replicas
    ASSERT_EQ(holders, want) << name << " is held by " << holders << " ranks";
    const double err = rel_l2(g, g_ref);
    EXPECT_LT(err, g_ref.size() < 64 ? 0.5 : 0.05) << "gradient of " << name;
    const int k = sharded(name) ? 1 : 0;
    if (err > worst[k]) worst[k] = err, worst_name[k] = name;
  }
  std::printf("%s: %zu gradients compared, worst rel L2: dense %.2e (%s), sharded experts %.2e (%s)\n", L.name,
              ref_grads.size(), worst[0], worst_name[0].c_str(), worst[1], worst_name[1].c_str());
}

INSTANTIATE_TEST_SUITE_P(Layouts, PpMeshGpu,
                         ::testing::Values(Layout{2, 2, 1, "pp2_dp2"}, Layout{2, 4, 2, "pp2_dp4_ep2"}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

}  // namespace
