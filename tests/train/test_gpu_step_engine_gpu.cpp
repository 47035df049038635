// The GPU step engine (train/cuda/gpu_step_engine.h), the step `trex bench train` times and `trex train --device
// cuda` runs: its layouts parse as `--mesh` did, and on one GPU its step is exactly the model's own (zero_grads,
// a LossAndGrad forward, backward, the optimiser), bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"
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
    EXPECT_EQ(got, want) << "step " << step;
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
  for (const std::string& name : ref.param_names()) EXPECT_EQ(engine.model().value(name), ref.value(name)) << name;
}

// Two models and optimisers built the same way and stepped the same way hold the same weights (the step is
// deterministic, not only the engine equal to the model): AdamW steps, then a Muon step.
TEST(GpuStepEngine, TwoIdenticalModelsStepIdentically) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny");
  dsv4gpu::GpuModelOptions mo;
  dsv4gpu::GpuModel m1(cfg, mo), m2(cfg, mo);
  dsv4gpu::GpuOptimizer o1(m1), o2(m2);
  m1.init_random(3), m2.init_random(3);
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
    for (auto* m : {&m1, &m2}) {
      m->zero_grads();
      m->forward(ids.data(), ids.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
      m->backward();
    }
    int64_t grads_differ = 0;
    for (const std::string& name : m1.param_names()) grads_differ += m1.grad(name) != m2.grad(name);
    EXPECT_EQ(grads_differ, 0) << "step " << step << ": gradients of the same step differ";
    a.step = step;
    if (step < 3) {
      o1.adamw_step(a), o2.adamw_step(a);
    } else {
      o1.step(muon, 1e-3, step, 0.5f), o2.step(muon, 1e-3, step, 0.5f);
    }
    std::vector<std::string> differ;
    for (const std::string& name : m1.param_names())
      if (m1.value(name) != m2.value(name)) differ.push_back(name);
    EXPECT_TRUE(differ.empty()) << "step " << step << ": " << differ.size() << " tensors differ, e.g. "
                                << (differ.empty() ? "" : differ.front());
  }
}
