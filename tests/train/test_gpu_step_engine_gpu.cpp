// The GPU step engine (train/cuda/gpu_step_engine.h), the step `trex bench train` times and `trex train --device
// cuda` runs: its layouts parse as `--mesh` did, and on one GPU its step is the model's own (zero_grads, a
// LossAndGrad forward, backward, the optimiser), bit for bit: every kernel of the training step is deterministic
// (the sparse attention backward sums each key row's dK + dV in a fixed order, kernels/cuda/attention_dkv_reduce.h;
// the embedding backward sums each row's tokens in order), so two runs of the same step give the same losses,
// gradients and weights, and AdamW / Muon (which magnify last-bit differences of near-zero gradients) keep them
// equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/gpu_test_util.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_step_engine.h"
#include "train/tiny_gpu_config.h"

using namespace trex;

namespace {

// Bit-identical tensors (memcmp: -0 / +0 and NaN payloads count). Asserted with a message naming the tensor and its
// relative L2 difference rather than EXPECT_EQ on the vectors, whose failure would print every element.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(GpuStepEngine, ParsesTheBenchLayouts) {
  EXPECT_TRUE(train::parse_gpu_layout("").one_gpu());
  EXPECT_EQ(train::parse_gpu_layout("").text, "single");
  const train::GpuLayout ep = train::parse_gpu_layout("ep=2");  // EP folded into DP
  EXPECT_EQ(ep.mesh.dp, 2);
  EXPECT_EQ(ep.mesh.ep, 2);
  const train::GpuLayout pp = train::parse_gpu_layout("pp=2,micro_batches=8,stage_layers=3+1");
  EXPECT_EQ(pp.mesh.pp, 2);
  EXPECT_EQ(pp.micro_batches, 8);
  EXPECT_EQ(pp.stage_layers, (std::vector<int64_t>{3, 1}));
  EXPECT_THROW(train::parse_gpu_layout("pp=2,dp=2"), Error);
}

TEST(GpuStepEngine, OneGpuStepIsTheModelsStep) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny");
  dsv4gpu::GpuModelOptions mo;
  mo.deterministic = true;  // bit-for-bit comparisons (the default atomic attention backward is not reproducible)
  train::GpuStepEngine engine(cfg, train::GpuLayout{}, mo);
  engine.model().init_random(3);
  dsv4gpu::GpuModel ref(cfg, mo);
  dsv4gpu::GpuOptimizer ref_opt(ref);
  ref.init_random(3);
  const int64_t B = 2, T = 64;
  std::mt19937_64 g(5);
  std::vector<int32_t> ids(size_t(B * T));
  const dsv4::SeqLayout layout = dsv4::SeqLayout::unpacked(B, T);
  cuda::AdamWStep a;
  a.lr = 1e-3, a.eps = 1e-8, a.weight_decay = 0.01;
  optim::OptimizerConfig muon;
  muon.kind = "muon";
  for (int64_t step = 1; step <= 3; ++step) {
    for (auto& t : ids) t = int32_t(g() % uint64_t(cfg.vocab_size));
    engine.zero_grads();
    const double got = engine.forward_backward(ids.data(), ids.data(), layout);
    ref.zero_grads();
    const double want = ref.forward(ids.data(), ids.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
    ref.backward();
    EXPECT_EQ(got, want) << "step " << step << ": same weights, same batch, same loss";
    a.step = step;
    if (step < 3) {
      engine.torch_adamw_step(a, /*timed=*/true);
      ref_opt.adamw_step(a);
    } else {
      engine.optimizer_step(muon, 1e-3, step, 0.5f);
      ref_opt.step(muon, 1e-3, step, 0.5f);
    }
  }
  EXPECT_GT(engine.optimizer_ms(), 0.0);  // the timed steps were measured
  int64_t differ = 0;
  for (const std::string& name : ref.param_names()) {
    const std::vector<float> got = engine.model().value(name), want = ref.value(name);
    differ += !same_bits(got, want);
    EXPECT_TRUE(same_bits(got, want)) << name << " differs (rel L2 " << trex::gpu_test::rel_err(got, want) << ")";
  }
  std::printf("engine vs model after 2 AdamW + 1 Muon steps: %lld of %zu weights differ in any bit\n",
              (long long)differ, ref.param_names().size());
}

// Two models and optimisers built the same way and stepped the same way: every step's loss, every gradient and
// every weight after AdamW and Muon steps are bit-identical (what activation recomputation and data-parallel
// replicas rely on).
TEST(GpuStepEngine, TwoIdenticalModelsStepAlike) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny");
  dsv4gpu::GpuModelOptions mo;
  mo.deterministic = true;
  dsv4gpu::GpuModel m1(cfg, mo), m2(cfg, mo);
  dsv4gpu::GpuOptimizer o1(m1), o2(m2);
  m1.init_random(3), m2.init_random(3);
  const int64_t B = 2, T = 64;
  std::mt19937_64 g(5);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  const dsv4::SeqLayout layout = dsv4::SeqLayout::unpacked(B, T);
  cuda::AdamWStep a;
  a.lr = 1e-3, a.eps = 1e-8, a.weight_decay = 0.01;
  optim::OptimizerConfig muon;
  muon.kind = "muon";
  for (int64_t step = 1; step <= 3; ++step) {
    for (auto& t : ids) t = int32_t(g() % uint64_t(cfg.vocab_size));
    double loss[2];
    int k = 0;
    for (auto* m : {&m1, &m2}) {
      m->zero_grads();
      loss[k++] = m->forward(ids.data(), ids.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
      m->backward();
    }
    EXPECT_EQ(loss[0], loss[1]) << "step " << step;
    int64_t grads_differ = 0;
    double worst_grad = 0;
    for (const std::string& name : m1.param_names()) {
      const std::vector<float> g1 = m1.grad(name), g2 = m2.grad(name);
      grads_differ += !same_bits(g1, g2);
      worst_grad = std::max(worst_grad, trex::gpu_test::rel_err(g1, g2));
      EXPECT_TRUE(same_bits(g1, g2)) << "step " << step << ": gradient " << name << " differs (rel L2 "
                                     << trex::gpu_test::rel_err(g1, g2) << ")";
    }
    a.step = step;
    if (step < 3) {
      o1.adamw_step(a), o2.adamw_step(a);
    } else {
      o1.step(muon, 1e-3, step, 0.5f), o2.step(muon, 1e-3, step, 0.5f);
    }
    double worst_w = 0;
    for (const std::string& name : m1.param_names()) {
      const std::vector<float> w1 = m1.value(name), w2 = m2.value(name);
      worst_w = std::max(worst_w, trex::gpu_test::rel_err(w1, w2));
      EXPECT_TRUE(same_bits(w1, w2)) << "step " << step << ": weight " << name << " differs (rel L2 "
                                     << trex::gpu_test::rel_err(w1, w2) << ")";
    }
    std::printf("step %lld: %lld of %zu gradients differ in any bit (worst rel L2 %.2e); weights worst rel L2 %.2e\n",
                (long long)step, (long long)grads_differ, m1.param_names().size(), worst_grad, worst_w);
  }
}
