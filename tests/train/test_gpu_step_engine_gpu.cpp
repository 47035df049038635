// The GPU step engine (train/cuda/gpu_step_engine.h), the step `trex bench train` times and `trex train --device
// cuda` runs: its layouts parse as `--mesh` did, and on one GPU its step is the model's own (zero_grads, a
// LossAndGrad forward, backward, the optimiser). Not bit for bit: the sparse attention backward accumulates dK / dV
// with fp32 atomics, so two runs of the same step differ in the last bits of a few gradients (the forward and every
// other kernel are deterministic, the embedding backward included); the comparisons allow that rounding only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/gpu_test_util.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_step_engine.h"
#include "train/tiny_gpu_config.h"

using namespace trex;

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
    if (step == 1) {
      EXPECT_EQ(got, want) << "the first forward (same weights, same batch) is deterministic";
    } else {
      EXPECT_NEAR(got, want, 1e-6 * std::abs(want)) << "step " << step;
    }
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
  double worst = 0;
  for (const std::string& name : ref.param_names()) {
    const double e = trex::gpu_test::rel_err(engine.model().value(name), ref.value(name));
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-4) << name;
  }
  std::printf("engine vs model after 2 AdamW + 1 Muon steps: worst weight rel L2 %.2e\n", worst);
}

// Two models and optimisers built the same way and stepped the same way: the first forward is bit-identical, the
// gradients agree up to the attention backward's atomic accumulation order (relative L2 below 1e-5 per tensor; the
// count of tensors that differ at all is printed), and so do the weights after AdamW and Muon steps.
TEST(GpuStepEngine, TwoIdenticalModelsStepAlike) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny");
  dsv4gpu::GpuModelOptions mo;
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
    if (step == 1) {
      EXPECT_EQ(loss[0], loss[1]) << "the forward is deterministic";
    }
    int64_t grads_differ = 0;
    double worst_grad = 0;
    for (const std::string& name : m1.param_names()) {
      const std::vector<float> g1 = m1.grad(name), g2 = m2.grad(name);
      grads_differ += g1 != g2;
      worst_grad = std::max(worst_grad, trex::gpu_test::rel_err(g1, g2));
    }
    EXPECT_LT(worst_grad, 1e-5) << "step " << step;
    a.step = step;
    if (step < 3) {
      o1.adamw_step(a), o2.adamw_step(a);
    } else {
      o1.step(muon, 1e-3, step, 0.5f), o2.step(muon, 1e-3, step, 0.5f);
    }
    double worst_w = 0;
    for (const std::string& name : m1.param_names())
      worst_w = std::max(worst_w, trex::gpu_test::rel_err(m1.value(name), m2.value(name)));
    EXPECT_LT(worst_w, 1e-4) << "step " << step;
    std::printf("step %lld: %lld of %zu gradients differ in any bit (worst rel L2 %.2e); weights worst rel L2 %.2e\n",
                (long long)step, (long long)grads_differ, m1.param_names().size(), worst_grad, worst_w);
  }
}
