// The MTP module's training step on the GPU (design §2.10: MTP input, MTP block, MTP head on the shared LM head,
// weighted loss) against the CPU fp32 model on the tiny GPU config with one MTP layer. Weights are bf16 values on
// both sides, the CPU's indexer and router selections (the MTP block's router too) are injected, so what remains
// is the GPU's bf16 activations; the tolerances are those of Dsv4Gpu.TrainingStepMatchesCpuModel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/model.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

void init_cpu(dsv4::Model<float>& m, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto& pt = m.params();
  for (const auto& p : pt.entries()) {
    float* w = pt.arena_value(p);
    const std::string& n = p.name;
    float mean = 0.f, sd = 1.f / std::sqrt(float(p.shape.back()));
    if (n.find("norm.weight") != std::string::npos) mean = 1.f, sd = 0.1f;
    if (n.find("hc_") != std::string::npos) sd = n.find("_fn") != std::string::npos ? 0.05f : 0.3f;
    if (n.find("attn_sink") != std::string::npos || n.find(".ape") != std::string::npos) sd = 0.3f;
    for (int64_t i = 0; i < p.numel; ++i) w[i] = bf16_round(mean + sd * nd(g));
  }
  for (auto& [name, b] : pt.bias)
    for (float& v : b) v = 0.05f * nd(g);
  const int64_t E = m.config().n_routed_experts, K = m.config().topk;
  for (auto& [name, t] : pt.tid2eid)
    for (size_t v = 0; v < t.size() / size_t(K); ++v) {
      const int32_t e0 = int32_t(g() % uint32_t(E));
      for (int64_t k = 0; k < K; ++k) t[v * size_t(K) + size_t(k)] = int32_t((e0 + 3 * k) % E);
    }
}

TEST(MtpGpu, TrainingStepWithTheMtpModuleMatchesCpuModel) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("MTP parity config", 1);
  const double w_mtp = 0.3;
  dsv4::ModelOptions o;
  o.use_mtp = true, o.mtp_weight = w_mtp, o.balance_alpha = 0.0;
  dsv4::Model<float> cpu(cfg, o);
  init_cpu(cpu, 31);
  const int64_t S = 64;
  const dsv4::SeqLayout layout = dsv4::SeqLayout::packed(S, {{S}, {40, 24}});
  const int64_t N = layout.n_tokens();
  std::mt19937 g(9);
  std::vector<int32_t> ids(static_cast<size_t>(N)), labels(static_cast<size_t>(N));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(g() % uint32_t(cfg.vocab_size));
    labels[i] = (i % 11 == 3) ? -100 : ids[i];
  }
  const double loss_cpu = cpu.forward(ids.data(), labels.data(), layout);
  const dsv4::LossParts parts = cpu.loss_parts();
  ASSERT_GT(parts.mtp, 0.0);
  ASSERT_GT(parts.mtp_targets, 0);
  cpu.params().zero_grads();
  cpu.backward();

  dsv4gpu::GpuModelOptions go;
  go.mtp_weight = w_mtp;
  dsv4gpu::GpuModel gpu(cfg, go);
  gpu.load_from(cpu.params());
  dsv4gpu::Injection inj;
  inj.csa_sel.resize(size_t(cfg.n_layers));
  inj.router_sel.resize(size_t(cfg.n_layers));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    if (cfg.attn_types[size_t(l)] == dsv4::AttnType::CSA) inj.csa_sel[size_t(l)] = cpu.attention_saved(l).sel;
    const int32_t* s = cpu.router_selection(l);
    inj.router_sel[size_t(l)].assign(s, s + N * cfg.topk);
  }
  const int32_t* ms = cpu.router_selection(cfg.n_layers);  // the MTP block
  inj.mtp_router_sel.assign(ms, ms + N * cfg.topk);
  gpu.zero_grads();
  const double loss_gpu = gpu.forward(ids.data(), labels.data(), layout, &inj, dsv4gpu::HeadMode::LossAndGrad);
  gpu.backward();
  std::printf("loss cpu %.6f (lm %.6f mtp %.6f) gpu %.6f rel %.2e\n", loss_cpu, parts.lm, parts.mtp, loss_gpu,
              std::abs(loss_gpu / loss_cpu - 1));
  EXPECT_NEAR(loss_gpu, loss_cpu, 1e-2 * std::abs(loss_cpu));

  // Every tensor's gradient, the MTP module's and the shared embedding / LM head's included.
  double num = 0, den = 0;
  int n_mtp = 0;
  for (const std::string& name : gpu.param_names()) {
    const auto& info = cpu.params().info(name);
    const float* ref = cpu.params().arena_grad(info);
    const std::vector<float> gg = gpu.grad(name);
    double tn = 0, td = 0;
    for (size_t i = 0; i < gg.size(); ++i) {
      tn += (double(gg[i]) - ref[i]) * (double(gg[i]) - ref[i]);
      td += double(ref[i]) * ref[i];
    }
    num += tn, den += td;
    if (!info.lm_grad) {
      EXPECT_EQ(tn, 0.0) << name;
      continue;
    }
    const double e = std::sqrt(tn / std::max(td, 1e-30));
    std::printf("grad %-48s rel L2 %.2e  |g| %.3e\n", name.c_str(), e, std::sqrt(td));
    EXPECT_TRUE(std::isfinite(e)) << name;
    EXPECT_LT(e, info.numel < 64 ? 0.5 : 0.1) << name;
    if (name.rfind("mtp.0.", 0) == 0) {
      ++n_mtp;
      EXPECT_GT(td, 0.0) << name << ": the CPU reference gives the MTP tensor no gradient";
    }
  }
  EXPECT_GT(n_mtp, 10);  // the MTP block, its input projections and norms, its hc_head
  const double e_all = std::sqrt(num / den);
  std::printf("all gradients rel L2 %.2e (%d MTP tensors)\n", e_all, n_mtp);
  EXPECT_LT(e_all, 5e-2);
}

// The loss-only forward followed by backward (the head's logits recomputed) gives the training forward's gradients.
TEST(MtpGpu, LossOnlyForwardThenBackwardMatchesTheTrainingForward) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("MTP parity config", 1);
  dsv4gpu::GpuModel a(cfg), b(cfg);
  a.init_random(5), b.init_random(5);
  const dsv4::SeqLayout layout = dsv4::SeqLayout::packed(64, {{64}, {30, 34}});
  std::vector<int32_t> ids(static_cast<size_t>(layout.n_tokens()));
  std::mt19937 g(3);
  for (auto& t : ids) t = int32_t(g() % uint32_t(cfg.vocab_size));
  a.zero_grads(), b.zero_grads();
  const double la = a.forward(ids.data(), ids.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
  const double lb = b.forward(ids.data(), ids.data(), layout, nullptr, dsv4gpu::HeadMode::Loss);
  a.backward(), b.backward();
  EXPECT_NEAR(la, lb, 1e-6 * std::abs(la));
  // The heads' own gradients agree to fp32 summation order (as HeadGradGpu's); below the heads those ~1e-7
  // differences of d(normed) reach bf16 casts and grow to bf16-level noise.
  const std::vector<std::pair<std::string, double>> checks{
      {"head.weight", 1e-3},         {"norm.weight", 1e-3},          {"mtp.0.norm.weight", 1e-3},
      {"mtp.0.e_proj.weight", 3e-2}, {"mtp.0.h_proj.weight", 3e-2}, {"embed.weight", 3e-2},
      {"layers.0.attn.wq_a.weight", 3e-2}};
  for (const auto& [name, tol] : checks) {
    const std::vector<float> ga = a.grad(name), gb = b.grad(name);
    double n = 0, d = 0;
    for (size_t i = 0; i < ga.size(); ++i) n += double(ga[i] - gb[i]) * (ga[i] - gb[i]), d += double(gb[i]) * gb[i];
    const double e = std::sqrt(n / std::max(d, 1e-30));
    std::printf("%-28s training forward vs recompute rel L2 %.2e\n", name.c_str(), e);
    EXPECT_GT(d, 0.0) << name;
    EXPECT_LT(e, tol) << name;
  }
}

// Stage-step mode: two micro-batches under begin_step (the step's main and MTP targets as the normalisers) give
// one batch's loss and gradients.
TEST(MtpGpu, StepModeAccumulatesMicroBatchesLikeOneBatch) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("MTP parity config", 1);
  const int64_t S = 64, V = cfg.vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(2 * S)), labels(ids.size());
  std::mt19937 g(21);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(g() % uint32_t(V));
    labels[i] = (i % 7 == 2) ? -100 : ids[i];
  }
  // The heads' targets of the step: label t + 1 (main) and t + 2 (MTP) of each sequence.
  int64_t targets = 0, mtp_targets = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < S; ++t) {
      targets += t + 1 < S && labels[size_t(b * S + t + 1)] >= 0;
      mtp_targets += t + 2 < S && labels[size_t(b * S + t + 2)] >= 0;
    }
  dsv4gpu::GpuModelOptions o;
  o.stage_slots = 2;
  dsv4gpu::GpuModel gpu(cfg, o);
  gpu.init_random(7);
  gpu.zero_grads();
  const double whole = gpu.forward(ids.data(), labels.data(), dsv4::SeqLayout::unpacked(2, S));
  gpu.backward();
  std::map<std::string, std::vector<float>> ref;
  for (const std::string& n : gpu.param_names()) ref[n] = gpu.grad(n);

  gpu.zero_grads();
  EXPECT_THROW(gpu.begin_step(targets), Error);  // the MTP head's normaliser is missing
  gpu.begin_step(targets, mtp_targets);
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(1, S);
  double loss = gpu.forward_stage(0, ids.data(), labels.data(), mb, nullptr);
  loss += gpu.forward_stage(1, ids.data() + S, labels.data() + S, mb, nullptr);
  gpu.backward_stage(1, nullptr);
  gpu.backward_stage(0, nullptr);
  std::printf("loss: whole batch %.7f, two micro-batches %.7f\n", whole, loss);
  EXPECT_NEAR(loss, whole, 1e-3 * std::abs(whole));
  double num = 0, den = 0;
  for (const auto& [name, r] : ref) {
    const std::vector<float> gg = gpu.grad(name);
    for (size_t i = 0; i < r.size(); ++i) num += double(gg[i] - r[i]) * (gg[i] - r[i]), den += double(r[i]) * r[i];
  }
  const double e = std::sqrt(num / den);
  std::printf("all gradients rel L2 %.2e (micro-batches vs one batch)\n", e);
  EXPECT_LT(e, 1e-2);
  gpu.zero_grads();
}

}  // namespace
