// The GPU model's optimiser step (GpuOptimizer::step) against the CPU optimiser (optim::Optimizer, the run's
// definition) on the tiny V4 config: the same weights and, per step, the same random gradients on both sides;
// after three steps every tensor's change (w - w0) must match. Muon's Newton-Schulz runs in bf16 products on the
// GPU (fp32 on the CPU), so its tensors match to about a percent; AdamW tensors to fp32 rounding. Under ZeRO-1
// (two ranks as threads on one GPU) the same steps equal one GPU's, Muon matrices cut between the ranks' slices
// included, and frozen tensors keep their weights and moments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <random>
#include <thread>

#include "comm/thread_group.h"

#include "model/dsv4/model.h"
#include "optim/optimizer.h"
#include "optim/param_groups.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

void init_weights(dsv4::ParamTable<float>& pt, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const auto& p : pt.entries()) {
    float* w = pt.arena_value(p);
    const bool norm = p.name.find("norm.weight") != std::string::npos;
    const float sd = norm ? 0.1f : 1.f / std::sqrt(float(p.shape.back()));
    for (int64_t i = 0; i < p.numel; ++i) w[i] = (norm ? 1.f : 0.f) + sd * nd(g);
  }
}

struct Diff {
  double delta_rel = 0, value_rel = 0;
};

// Relative L2 of the GPU's change against the CPU's, and of the values.
Diff compare(const std::vector<float>& gpu, const float* cpu, const std::vector<float>& w0) {
  double dn = 0, dd = 0, vn = 0, vd = 0;
  for (size_t i = 0; i < w0.size(); ++i) {
    const double dg = double(gpu[i]) - w0[i], dc = double(cpu[i]) - w0[i];
    dn += (dg - dc) * (dg - dc), dd += dc * dc;
    vn += (double(gpu[i]) - cpu[i]) * (double(gpu[i]) - cpu[i]), vd += double(cpu[i]) * cpu[i];
  }
  return {std::sqrt(dn / std::max(dd, 1e-300)), std::sqrt(vn / std::max(vd, 1e-300))};
}

void run_against_cpu(const optim::OptimizerConfig& oc, double lr, double muon_tol) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("optimizer test config");
  dsv4::ModelOptions mo;
  mo.balance_alpha = 0.0;
  mo.use_mtp = false;
  dsv4::Model<float> cpu(cfg, mo);
  auto& pt = cpu.params();
  init_weights(pt, 5);
  dsv4gpu::GpuModel gpu(cfg);
  dsv4gpu::GpuOptimizer gpu_opt(gpu);
  gpu.load_from(pt);
  std::vector<optim::ParamRef> refs;
  std::map<std::string, std::vector<float>> w0;
  for (const auto& e : pt.entries()) {
    refs.push_back({e.name, e.shape, pt.arena_value(e), pt.arena_grad(e), optim::dsv4_param_group(e.name, e.shape)});
    w0[e.name].assign(pt.arena_value(e), pt.arena_value(e) + e.numel);
  }
  optim::Optimizer opt(refs, oc);
  const std::vector<std::string> names = gpu.param_names();  // load_from checked the CPU has each
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t step = 1; step <= 3; ++step) {
    for (const std::string& n : names) {
      const auto& info = pt.info(n);
      std::vector<float> grad(size_t(info.numel));
      const float scale = 1e-2f * float(1 + step);
      for (float& x : grad) x = scale * nd(g);
      std::copy(grad.begin(), grad.end(), pt.arena_grad(info));
      gpu.set_grad(n, grad);
    }
    opt.step(lr);
    gpu_opt.step(oc, lr, step);
  }
  int n_muon = 0, n_adamw = 0;
  double worst_muon = 0, worst_adamw = 0;
  for (const std::string& n : names) {
    const auto& info = pt.info(n);
    const bool muon = oc.kind == "muon" && optim::dsv4_param_group(n, info.shape) == optim::ParamGroup::Muon;
    const Diff d = compare(gpu.value(n), pt.arena_value(info), w0[n]);
    std::printf("%-6s %-48s %-12s change rel L2 %.2e  value rel L2 %.2e\n", muon ? "muon" : "adamw", n.c_str(),
                shape_str(info.shape).c_str(), d.delta_rel, d.value_rel);
    if (muon) {
      EXPECT_LT(d.delta_rel, muon_tol) << n;
      EXPECT_LT(d.value_rel, 1e-2) << n;
      worst_muon = std::max(worst_muon, d.delta_rel), ++n_muon;
    } else {
      EXPECT_LT(d.delta_rel, 1e-4) << n;
      worst_adamw = std::max(worst_adamw, d.delta_rel), ++n_adamw;
    }
  }
  std::printf("%s: %d Muon tensors (worst change rel L2 %.2e), %d AdamW tensors (worst %.2e)\n", oc.kind.c_str(),
              n_muon, worst_muon, n_adamw, worst_adamw);
  if (oc.kind == "muon") {
    EXPECT_GT(n_muon, 20);
  }
}

TEST(OptimizerGpu, MuonMatchesCpuOptimizer) {
  optim::OptimizerConfig oc;  // kind muon, the design's defaults (momentum 0.95 Nesterov, 8 + 2 NS steps, 0.18)
  oc.adamw.eps = 1e-8;
  run_against_cpu(oc, 1e-2, 4e-2);
}

TEST(OptimizerGpu, MuonWithoutNesterovAndOtherScales) {
  optim::OptimizerConfig oc;
  oc.adamw.eps = 1e-8;
  oc.adamw.decay_vectors = false;  // AdamW tensors under 2 dims undecayed
  oc.muon.nesterov = false;
  oc.muon.momentum = 0.9;
  oc.muon.weight_decay = 0.05;
  oc.muon.update_rms = 0.2;
  oc.muon_lr_scale = 2.0;
  run_against_cpu(oc, 5e-3, 4e-2);
}

TEST(OptimizerGpu, AdamWWithoutVectorDecayMatchesCpu) {
  optim::OptimizerConfig oc;
  oc.kind = "adamw";
  oc.adamw.eps = 1e-8;
  oc.adamw.decay_vectors = false;
  run_against_cpu(oc, 1e-2, 0);
}

// Clipping and accumulation fold their scale into the optimiser's read of the gradients (grad_scale): the update
// must be bit-identical to scaling the gradients in a pass of their own first, for AdamW and Muon tensors alike.
void grad_scale_fold_is_exact(const optim::OptimizerConfig& oc) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("optimizer test config");
  dsv4gpu::GpuModel folded(cfg), scaled(cfg);
  dsv4gpu::GpuOptimizer folded_opt(folded), scaled_opt(scaled);
  folded.init_random(3), scaled.init_random(3);
  std::mt19937 g(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  const float scale = 0.37f;
  for (int64_t step = 1; step <= 2; ++step) {
    for (const std::string& n : folded.param_names()) {
      std::vector<float> grad(folded.value(n).size());
      for (float& x : grad) x = 0.05f * nd(g);
      folded.set_grad(n, grad), scaled.set_grad(n, grad);
    }
    scaled.scale_grads(scale);
    scaled_opt.step(oc, 1e-2, step);
    folded_opt.step(oc, 1e-2, step, scale);
  }
  int64_t differing = 0;
  for (const std::string& n : folded.param_names()) differing += folded.value(n) != scaled.value(n);
  EXPECT_EQ(differing, 0) << oc.kind << ": tensors whose update differs between the folded and the separate scale";
}

TEST(OptimizerGpu, GradScaleFoldEqualsScalingTheGradientsFirst) {
  optim::OptimizerConfig oc;
  oc.adamw.eps = 1e-8;
  grad_scale_fold_is_exact(oc);  // Muon + AdamW groups
  oc.kind = "adamw";
  grad_scale_fold_is_exact(oc);  // the flat AdamW pass
}

// Three Muon steps (AdamW without vector decay for the rest) from the same weights and gradients on one GPU and
// on two ZeRO-1 ranks, with the router gates and the embedding frozen (the embedding's bucket wholly frozen), the
// MTP module's tensors included: every trained tensor ends where one GPU puts it (AdamW: the same kernel on the
// same numbers; Muon: the same arithmetic, batched differently), every frozen one bit-unchanged with zero moments.
TEST(OptimizerGpu, Zero1MuonWithFrozenTensorsEqualsOneGpu) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("ZeRO-1 optimizer test config", 1);
  dsv4::ModelOptions mo;
  mo.balance_alpha = 0.0;
  mo.use_mtp = true;
  dsv4::Model<float> cpu(cfg, mo);
  init_weights(cpu.params(), 5);
  optim::OptimizerConfig oc;
  oc.adamw.eps = 1e-8;
  oc.adamw.decay_vectors = false;
  std::vector<std::string> frozen, names;
  for (const auto& e : cpu.params().entries()) {
    names.push_back(e.name);
    if (optim::glob_match("*.ffn.gate.weight", e.name) || e.name == "embed.weight") frozen.push_back(e.name);
  }
  ASSERT_GT(frozen.size(), 2u);
  // The gradients of every step, by name (the same on every model).
  std::vector<std::map<std::string, std::vector<float>>> grads(3);
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t step = 0; step < grads.size(); ++step)
    for (const auto& e : cpu.params().entries()) {
      std::vector<float>& v = grads[step][e.name];
      v.resize(size_t(e.numel));
      for (float& x : v) x = 1e-2f * float(2 + step) * nd(g);
    }
  // values[r]: tensor -> final value; moments[r]: frozen tensor -> its first / second moment.
  using Values = std::map<std::string, std::vector<float>>;
  auto train = [&](dsv4gpu::GpuModel& model, Values& values, Values& moments) {
    dsv4gpu::GpuOptimizer opt(model);
    opt.set_frozen(frozen);
    model.load_from(cpu.params());
    for (size_t step = 0; step < grads.size(); ++step) {
      for (const std::string& n : names) model.set_grad(n, grads[step][n]);
      opt.step(oc, 1e-2, int64_t(step + 1));
    }
    for (const std::string& n : names) values[n] = model.gather_shard(n);  // collective: same order everywhere
    for (const std::string& n : frozen) {
      moments[n + ".0"] = model.gather_shard(n, opt.moment(0));
      moments[n + ".1"] = model.gather_shard(n, opt.moment(1));
    }
  };
  Values one, one_m;
  {
    dsv4gpu::GpuModel model(cfg);
    train(model, one, one_m);
  }
  Values two[2], two_m[2];
  {
    auto group = comm::make_thread_group(2, 120.0);
    std::string errors[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          dsv4gpu::GpuModelOptions go;
          go.dp = group[size_t(r)].get();
          dsv4gpu::GpuModel model(cfg, go);
          train(model, two[r], two_m[r]);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    ASSERT_TRUE(errors[0].empty() && errors[1].empty()) << "rank 0: " << errors[0] << "\nrank 1: " << errors[1];
  }
  const std::set<std::string> is_frozen(frozen.begin(), frozen.end());
  int n_muon = 0;
  double worst_muon = 0;
  for (const auto& e : cpu.params().entries()) {
    const std::string& n = e.name;
    const std::vector<float> w0(cpu.params().value(n), cpu.params().value(n) + e.numel);
    EXPECT_EQ(two[0][n], two[1][n]) << n << ": the two ranks disagree";
    if (is_frozen.count(n)) {
      EXPECT_EQ(one[n], w0) << n << ": frozen, moved on one GPU";
      EXPECT_EQ(two[0][n], w0) << n << ": frozen, moved under ZeRO-1";
      for (const char* k : {".0", ".1"}) {
        const std::vector<float> zero(w0.size(), 0.f);
        EXPECT_EQ(one_m[n + k], zero) << n << k << ": a frozen tensor's moment changed on one GPU";
        EXPECT_EQ(two_m[0][n + k], zero) << n << k << ": a frozen tensor's moment changed under ZeRO-1";
      }
      continue;
    }
    const Diff d = compare(two[0][n], one[n].data(), w0);
    const bool muon = optim::dsv4_param_group(n, e.shape) == optim::ParamGroup::Muon;
    std::printf("%-6s %-48s change rel L2 (ZeRO-1 vs one GPU) %.2e\n", muon ? "muon" : "adamw", n.c_str(),
                d.delta_rel);
    if (muon) {  // bf16 Newton-Schulz products in batches of other sizes: a GEMM algorithm of its own may round apart
      EXPECT_LT(d.delta_rel, 1e-2) << n;
      worst_muon = std::max(worst_muon, d.delta_rel), ++n_muon;
    } else {
      EXPECT_LT(d.delta_rel, 1e-6) << n;
    }
  }
  std::printf("%d Muon tensors, worst change rel L2 %.2e\n", n_muon, worst_muon);
  EXPECT_GT(n_muon, 20);
}

}  // namespace
