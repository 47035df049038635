// Interleaved pipeline stages on the GPU (train/cuda/gpu_pipeline.h with vpp = V > 1 chunks per rank), combined
// with data and expert parallelism, every rank a thread of this process on ONE GPU over thread-group
// communicators (comm/thread_group.h): world rank = stage * D + dp_rank; rank s's chunk c is a GpuModel of
// virtual stage c P + s (dsv4::split_layers over P V chunks, the CPU trainer's split, padded with no-op layers when
// the layout asks); the chunks of one rank share its stage's DP group (and EP group), as the mesh gives them.
//
// PpVppGpu.MatchesOneRankOnTheGlobalBatch/{pp2_vpp2, pp2_vpp2_dp2, pp2_vpp2_dp2_ep2, pp2_vpp2_pad2}: 2 steps of
// the interleaved schedule (M = 4 micro-batches per DP rank, a multiple of pp) with an AdamW step between, against
// one rank accumulating the global batch's D M micro-batches (same micro-batch shape, same kernels) under
// begin_step. Every step's loss (the last virtual stage's shares summed over DP) within the tolerances of the 1F1B
// tests (test_pp_mesh_gpu.cpp); after step 1 every gradient by name and the global gradient norm (each chunk's DP
// norm, squares summed over the chunks and stages); after step 2 every weight's update (fp32 master, gathered over
// DP) by name. Each tensor lives on exactly one virtual stage (per DP / EP replica).
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
#include "model/dsv4/partition.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_pipeline.h"
#include "train/gpu_mesh_test_support.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using Tensors = std::map<std::string, std::vector<float>>;

constexpr int64_t kS = 64, kM = 4;  // tokens per micro-batch, micro-batches per DP rank
constexpr int kSteps = 2;

struct Layout {
  int pp, vpp, dp, ep;
  int64_t layers, pad;  // the model's layers; no-op padding layers (split_layers' identity_layers)
  const char* name;
};

using trex::gpu_test::rel_l2;

// The tiny config with n layers (the sliding / CSA / HCA pattern repeated; the first layer hash-routed).
dsv4::ModelConfig config_with(int64_t n) {
  return trex::testing::tiny_gpu_config_layers(n, fmt::format("vpp test config ({} layers)", n));
}

// The global batch: D * M micro-batches of one 64-token sequence; DP rank d runs micro-batches [d M, (d+1) M).
void make_batch(int64_t V, int D, std::vector<int32_t>& ids, std::vector<int32_t>& labels) {
  trex::testing::make_global_batch(V, D * kM, kS, 29, ids, labels);
}

using trex::testing::is_expert_tensor;
constexpr auto adamw = trex::testing::pipeline_adamw;

class PpVppGpu : public ::testing::TestWithParam<Layout> {};

TEST_P(PpVppGpu, MatchesOneRankOnTheGlobalBatch) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const Layout L = GetParam();
  const int P = L.pp, V = L.vpp, D = L.dp, EP = L.ep, N = P * D;
  const dsv4::ModelConfig cfg = config_with(L.layers);
  ASSERT_EQ(cfg.n_routed_experts % EP, 0);
  std::vector<int32_t> ids, labels;
  make_batch(cfg.vocab_size, D, ids, labels);
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(1, kS);

  // One rank: the global batch's micro-batches in order, accumulated under one begin_step.
  const trex::testing::OneRankReference ref = trex::testing::one_rank_reference(cfg, ids, labels, D * kM, kS, kSteps);
  const std::vector<double>& ref_losses = ref.losses;
  const double ref_norm = ref.grad_norm;
  const Tensors &ref_grads = ref.grads, &ref_init = ref.init, &ref_final = ref.final;

  // The virtual stages' layer ranges: the padded split must put at least one layer on every chunk.
  const std::vector<dsv4::ModelPartition> parts = dsv4::split_layers(cfg, int64_t(P) * V, L.pad);
  for (int g = 0; g < P * V; ++g) {
    const dsv4::ModelPartition& p = parts[size_t(g)];
    std::printf("%s: virtual stage %d holds layers [%lld, %lld) + %lld no-op\n", L.name, g,
                static_cast<long long>(p.layer_begin), static_cast<long long>(p.layer_end),
                static_cast<long long>(p.identity_layers));
    ASSERT_GT(p.layer_end, p.layer_begin) << "virtual stage " << g << " gets no layer";
  }

  // The mesh's groups, each its own thread group: per stage a DP group (and EP groups), per DP index the four
  // pipeline directions.
  const trex::testing::PipelineMeshGroups groups(P, D, EP, 4);  // act, grad, act_wrap, grad_wrap
  struct RankOut {
    std::vector<double> losses;
    Tensors dense, expert, final_dense, final_expert;  // dense / experts: as test_pp_mesh_gpu.cpp
    double norm_sq = 0;  // the chunks' squared DP gradient norms after step 1 (counted once per stage: d == 0)
  };
  std::vector<RankOut> out(static_cast<size_t>(N));
  trex::testing::run_ranks(N, [&](int w) {
    const int s = w / D, d = w % D;
    const std::vector<int> slots = dsv4gpu::GpuPipeline::chunk_slots(s, P, V, kM);
    std::vector<std::unique_ptr<dsv4gpu::GpuModel>> models;
    std::vector<std::unique_ptr<dsv4gpu::GpuOptimizer>> opts;
    std::vector<dsv4gpu::GpuModel*> chunks;
    for (int c = 0; c < V; ++c) {
      const dsv4::ModelPartition& part = parts[size_t(c * P + s)];
      dsv4gpu::GpuModelOptions o;
      o.layer_begin = part.layer_begin, o.layer_end = part.layer_end;
      o.stage_slots = slots[size_t(c)];
      o.dp = groups.dp(s, d);
      o.ep = groups.ep(s, d);
      models.push_back(std::make_unique<dsv4gpu::GpuModel>(cfg, o));
      opts.push_back(std::make_unique<dsv4gpu::GpuOptimizer>(*models.back()));
      models.back()->init_random(5);
      chunks.push_back(models.back().get());
    }
    RankOut& r = out[size_t(w)];
    dsv4gpu::GpuPipeline pipe(chunks, groups.direction(0, s, d), groups.direction(1, s, d),
                              &groups.direction(2, s, d), &groups.direction(3, s, d), kM);
    EXPECT_EQ(pipe.chunks(), V);
    const int64_t off = d * kM * kS;
    std::vector<double> local;
    for (int step = 1; step <= kSteps; ++step) {
      for (auto& m : models) m->zero_grads();
      local.push_back(pipe.step(ids.data() + off, labels.data() + off, mb));
      if (step == 1)
        for (auto& m : models) {
          const double n = m->dp_grad_norm();  // collective over the stage's DP group
          if (d == 0) r.norm_sq += n * n;
          if (D == 1) {  // one rank per stage: its gradients are whole
            for (const std::string& n : m->param_names()) r.dense[n] = m->grad(n);
            continue;
          }
          dsv4gpu::DevMem acc(size_t(m->shard_elems()) * sizeof(float));
          TREX_CUDA(cudaMemset(acc.as<float>(), 0, size_t(m->shard_elems()) * sizeof(float)));
          m->add_reduced_grads_to(acc.as<float>());
          for (const std::string& n : m->param_names())
            (EP > 1 && is_expert_tensor(n) ? r.expert : r.dense)[n] = m->gather_shard(n, acc.as<float>());
        }
      for (auto& o : opts) o->adamw_step(adamw(step));
    }
    for (auto& m : models)
      for (const std::string& n : m->param_names())
        (EP > 1 && is_expert_tensor(n) ? r.final_expert : r.final_dense)[n] = m->gather_shard(n);  // the fp32 master
    r.losses = pipe.global_losses(local);  // this DP rank's share of each step, from the last stage
  });
  if (HasFailure()) return;

  for (int step = 0; step < kSteps; ++step) {
    double loss = 0;
    for (int d = 0; d < D; ++d) loss += out[size_t(d)].losses[size_t(step)];
    for (int d = 0; d < D; ++d)
      EXPECT_EQ(out[size_t(d)].losses[size_t(step)], out[size_t((P - 1) * D + d)].losses[size_t(step)])
          << "pipeline " << d << ": the stages report different losses";
    std::printf("%s step %d: loss one rank %.6f, interleaved pipeline %.6f\n", L.name, step + 1,
                ref_losses[size_t(step)], loss);
    const double tol = (step == 0 ? 2e-3 : 5e-3) * std::abs(ref_losses[size_t(step)]);
    EXPECT_NEAR(loss, ref_losses[size_t(step)], tol) << "step " << step + 1;
  }
  EXPECT_LT(ref_losses.back(), ref_losses.front()) << "training did not lower the loss";
  double norm_sq = 0;
  for (int s = 0; s < P; ++s) norm_sq += out[size_t(s * D)].norm_sq;
  std::printf("%s: gradient norm one rank %.6f, interleaved pipeline %.6f\n", L.name, ref_norm, std::sqrt(norm_sq));
  EXPECT_NEAR(std::sqrt(norm_sq), ref_norm, 1e-2 * ref_norm);

  // Gradients after step 1 and weight updates after step 2, by name: each tensor on exactly one virtual stage
  // (its DP ranks, or an expert's EDP replicas, holding the same reduced values).
  auto sharded = [EP](const std::string& n) { return EP > 1 && is_expert_tensor(n); };
  double worst_grad = 0, worst_update = 0;
  std::string worst_grad_name, worst_update_name;
  for (const auto& [name, g_ref] : ref_grads) {
    std::vector<float> g, w;
    int holders = 0;
    for (int rk = 0; rk < N; ++rk) {
      const RankOut& r = out[size_t(rk)];
      const Tensors& mine = sharded(name) ? r.expert : r.dense;
      const Tensors& fin = sharded(name) ? r.final_expert : r.final_dense;
      auto it = mine.find(name);
      if (it == mine.end()) continue;
      if (++holders == 1) g = it->second, w = fin.at(name);
      EXPECT_EQ(it->second, g) << name << ": the ranks holding it disagree on the reduced gradient";
      EXPECT_EQ(fin.at(name), w) << name << ": the ranks holding it disagree on the updated weight";
    }
    ASSERT_EQ(holders, sharded(name) ? D / EP : D) << name << " is held by " << holders << " ranks";
    const double err = rel_l2(g, g_ref);
    EXPECT_LT(err, g_ref.size() < 64 ? 0.5 : 0.05) << "gradient of " << name;
    if (err > worst_grad) worst_grad = err, worst_grad_name = name;
    // The update (final - initial), not the weights (whose norm would hide it). AdamW normalises each element, so
    // a near-zero gradient's bf16-level difference moves its element by up to lr either way: a looser bound than
    // the gradients' (a tensor on the wrong stage or missing an update is off by 1 or more).
    const std::vector<float>& w0 = ref_init.at(name);
    std::vector<float> du(w0.size()), du_ref(w0.size());
    for (size_t i = 0; i < w0.size(); ++i) du[i] = w[i] - w0[i], du_ref[i] = ref_final.at(name)[i] - w0[i];
    const double uerr = rel_l2(du, du_ref);
    // The mHC mixing tensors (hc_*: tiny init, fp32) are after two steps mostly their AdamW updates, about
    // lr x sign(g) per element, and the one-rank reference itself is not reproducible at that level (its step-2
    // loss moved by 1e-3 between H200 runs: the default backward's atomics), so their updates are sign noise (rel
    // L2 up to 2.4 measured on hc_head_scale); they are checked by their gradients above, not their updates.
    // Other tensors' update noise reaches 0.25 on the padded layout and 0.62 on a tensor of fewer than 64 elements
    // (a few elements of near-zero gradient flip sign, and in a small tensor each weighs much). A missing update
    // is exactly 1 and one on the wrong stage 1 or more, so 0.35 and, for small tensors, 0.8 still catch both.
    if (name.find("hc_") == std::string::npos) EXPECT_LT(uerr, w0.size() < 64 ? 0.8 : 0.35) << "update of " << name;
    if (uerr > worst_update) worst_update = uerr, worst_update_name = name;
  }
  std::printf("%s: %zu tensors compared, worst rel L2: gradient %.2e (%s), update %.2e (%s)\n", L.name,
              ref_grads.size(), worst_grad, worst_grad_name.c_str(), worst_update, worst_update_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Layouts, PpVppGpu,
                         ::testing::Values(Layout{2, 2, 1, 1, 4, 0, "pp2_vpp2"},
                                           Layout{2, 2, 2, 1, 4, 0, "pp2_vpp2_dp2"},
                                           Layout{2, 2, 2, 2, 4, 0, "pp2_vpp2_dp2_ep2"},
                                           // 10 layers padded to 12: virtual stages of 3, 3, 3 and 1 + 2 no-op
                                           // layers (unpadded: 3, 3, 2, 2).
                                           Layout{2, 2, 1, 1, 10, 2, "pp2_vpp2_pad2"}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

// The compute order the pipeline walks is the CPU trainer's interleaved schedule, and the slots each chunk needs.
TEST(PpVppGpu, InterleavedOrderAndSlots) {
  // pp = 2, vpp = 2, M = 4, rank 0: (pp - r - 1) * 2 + (vpp - 1) * pp = 4 warm-up chunk-forwards, then the
  // steady state's first forward before its first backward: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 ...
  const auto order = dsv4gpu::GpuPipeline::compute_order(0, 2, 2, 4);
  ASSERT_EQ(order.size(), size_t(16));
  int warm = 0;
  while (order[size_t(warm)].forward) ++warm;
  EXPECT_EQ(warm, 5);
  EXPECT_EQ(order[0].chunk, 0);
  EXPECT_EQ(order[2].chunk, 1);  // groups of pp micro-batches per chunk
  const std::vector<int> slots = dsv4gpu::GpuPipeline::chunk_slots(0, 2, 2, 4);
  EXPECT_EQ(slots, (std::vector<int>{4, 2}));  // chunk 0 holds every micro-batch before its first backward
  EXPECT_EQ(dsv4gpu::GpuPipeline::chunk_slots(1, 2, 2, 4), (std::vector<int>{3, 1}));
  EXPECT_EQ(dsv4gpu::GpuPipeline::chunk_slots(1, 2, 1, 4), std::vector<int>{1});  // 1F1B: P - r
  EXPECT_EQ(dsv4gpu::GpuPipeline::chunk_slots(0, 2, 1, 4), std::vector<int>{2});
}

}  // namespace
