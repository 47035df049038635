// GPU training step vs the CPU fp32 model on a full, fixture-like random model (every attention type, hash and
// score MoE, shared expert, packed documents). The tiny fixture's head_dim 32 is below what the CUDA attention
// kernel supports (256 / 512), so the config keeps the tiny shapes but uses head_dim 256. Weights are rounded to
// bf16 values on the CPU too, so the remaining differences are the GPU's bf16 activations. The CPU's indexer and
// router selections are injected (bf16 rounding can flip near-ties; a flipped selection is a discrete change, not
// an error); a second forward without injection checks how often the GPU's own choices agree. swiglu_limit is
// the real configs' 10: with a small limit (0.8 was tried) bf16 rounding moves ~0.3% of the expert
// pre-activations across the clamp, whose gradient is discontinuous, and the w1/w3 gradients then differ by
// 10-20% (the clamp itself is checked by the kernel test against the CPU SwiGLU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "core/dtype.h"
#include "model/dsv4/model.h"
#include "optim/update_rules.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

dsv4::ModelConfig parity_config() { return trex::testing::tiny_gpu_config("parity config"); }

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

double rel_err(const std::vector<float>& got, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

bool p_small(const dsv4::ParamInfo& p) { return p.numel < 64; }

struct Batch {
  dsv4::SeqLayout layout;
  std::vector<int32_t> ids, labels;
};

Batch make_batch(int64_t V) {
  Batch b;
  const int64_t S = 64;
  b.layout = dsv4::SeqLayout::packed(S, {{S}, {40, 24}});
  std::mt19937 g(7);
  b.ids.resize(size_t(2 * S));
  b.labels.resize(b.ids.size());
  for (size_t i = 0; i < b.ids.size(); ++i) {
    b.ids[i] = int32_t(g() % uint32_t(V));
    b.labels[i] = (i % 13 == 5) ? -100 : b.ids[i];
  }
  return b;
}

// balance_alpha 0: the LM loss alone; 0.3: the sequence-wise balance loss large enough that its gradient dominates
// the routers' (the V4 default 1e-4 would hide an error in it).
void training_step_matches_cpu_model(double balance_alpha) {
  const dsv4::ModelConfig cfg = parity_config();
  dsv4::ModelOptions o;
  o.balance_alpha = balance_alpha;
  o.use_mtp = false;
  dsv4::Model<float> cpu(cfg, o);
  init_cpu(cpu, 11);
  const Batch bt = make_batch(cfg.vocab_size);
  const double loss_cpu = cpu.forward(bt.ids.data(), bt.labels.data(), bt.layout);
  cpu.params().zero_grads();
  cpu.backward();
  const int64_t N = bt.layout.n_tokens();

  dsv4gpu::GpuModelOptions go;
  go.balance_alpha = balance_alpha;
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
  const double loss_gpu = gpu.forward(bt.ids.data(), bt.labels.data(), bt.layout, &inj);
  gpu.zero_grads();
  gpu.backward();
  std::printf("loss cpu %.6f gpu %.6f rel %.2e\n", loss_cpu, loss_gpu, std::abs(loss_gpu / loss_cpu - 1));
  EXPECT_NEAR(loss_gpu, loss_cpu, 1e-2 * std::abs(loss_cpu));
  const std::vector<float> normed = gpu.final_normed();
  const double e_normed = rel_err(normed, cpu.final_normed(), normed.size());
  std::printf("final normed hidden rel L2 %.2e\n", e_normed);
  EXPECT_LT(e_normed, 3e-2);

  // Gradients, tensor by tensor and all together.
  double num = 0, den = 0, worst = 0;
  std::string worst_name;
  int n_checked = 0;
  for (const std::string& name : gpu.param_names()) {
    const auto& info = cpu.params().info(name);
    const float* ref = cpu.params().arena_grad(info);
    const std::vector<float> g = gpu.grad(name);
    double tn = 0, td = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      tn += (double(g[i]) - ref[i]) * (double(g[i]) - ref[i]);
      td += double(ref[i]) * ref[i];
    }
    num += tn, den += td;
    if (!info.lm_grad) {  // the indexer: no gradient from the LM loss on either side
      EXPECT_EQ(tn, 0.0) << name;
      continue;
    }
    const double e = std::sqrt(tn / std::max(td, 1e-30));
    std::printf("grad %-48s rel L2 %.2e  |g| %.3e\n", name.c_str(), e, std::sqrt(td));
    EXPECT_TRUE(std::isfinite(e)) << name;
    if (e > worst) worst = e, worst_name = name;
    // Tensors of a few elements (mHC base/scale, sinks) are sums over all tokens with heavy cancellation:
    // their relative error measures the bf16 noise of the per-token terms against a small total.
    EXPECT_LT(e, p_small(info) ? 0.5 : 0.1) << name;
    ++n_checked;
  }
  const double e_all = std::sqrt(num / den);
  std::printf("all gradients rel L2 %.2e over %d tensors; worst %s %.2e\n", e_all, n_checked, worst_name.c_str(),
              worst);
  EXPECT_LT(e_all, 5e-2);

  // AdamW on the device against the CPU update rule, from the same gradients.
  optim::AdamWConfig ac;
  ac.eps = 1e-8;
  cuda::AdamWStep as;
  as.lr = 1e-3, as.beta1 = ac.beta1, as.beta2 = ac.beta2, as.eps = ac.eps, as.weight_decay = ac.weight_decay;
  as.step = 1;
  const std::string wname = "layers.1.attn.wq_b.weight";
  std::vector<float> w = gpu.value(wname), g = gpu.grad(wname);
  std::vector<float> m1(w.size(), 0.f), v1(w.size(), 0.f);
  dsv4gpu::GpuOptimizer(gpu).adamw_step(as);
  optim::adamw_update(w.data(), g.data(), m1.data(), v1.data(), int64_t(w.size()), as.lr, ac, 1, true);
  const std::vector<float> w_gpu = gpu.value(wname);
  EXPECT_LT(rel_err(w_gpu, w.data(), w.size()), 1e-6);
}

TEST(Dsv4Gpu, TrainingStepMatchesCpuModel) { training_step_matches_cpu_model(0.0); }

TEST(Dsv4Gpu, TrainingStepWithBalanceLossMatchesCpuModel) {
  training_step_matches_cpu_model(0.3);
}

TEST(Dsv4Gpu, OwnSelectionsAgreeWithCpu) {
  const dsv4::ModelConfig cfg = parity_config();
  dsv4::ModelOptions o;
  o.balance_alpha = 0.0;
  o.use_mtp = false;
  dsv4::Model<float> cpu(cfg, o);
  init_cpu(cpu, 23);
  const Batch bt = make_batch(cfg.vocab_size);
  const double loss_cpu = cpu.forward(bt.ids.data(), bt.labels.data(), bt.layout);
  dsv4gpu::GpuModel gpu(cfg);
  gpu.load_from(cpu.params());
  const double loss_gpu = gpu.forward(bt.ids.data(), bt.labels.data(), bt.layout);
  const int64_t N = bt.layout.n_tokens(), k = cfg.index_topk, K = cfg.topk;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    if (cfg.attn_types[size_t(l)] == dsv4::AttnType::CSA) {
      const std::vector<int64_t> gs = gpu.csa_selection(l);
      const std::vector<int64_t>& cs = cpu.attention_saved(l).sel;
      int64_t same = 0, total = 0;
      for (int64_t i = 0; i < N; ++i) {
        std::vector<int64_t> a(gs.begin() + i * k, gs.begin() + (i + 1) * k), b(cs.begin() + i * k, cs.begin() + (i + 1) * k);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        total += 1;
        same += a == b;
      }
      std::printf("layer %ld indexer: %ld of %ld queries select the same entries as the CPU\n", long(l), long(same),
                  long(total));
      EXPECT_GE(double(same), 0.9 * double(total));
    }
    const std::vector<int32_t> gr = gpu.router_selection(l);
    const int32_t* cr = cpu.router_selection(l);
    int64_t same = 0;
    for (int64_t i = 0; i < N; ++i) {
      std::vector<int32_t> a(gr.begin() + i * K, gr.begin() + (i + 1) * K), b(cr + i * K, cr + (i + 1) * K);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      same += a == b;
    }
    std::printf("layer %ld router: %ld of %ld tokens pick the same experts\n", long(l), long(same), long(N));
    EXPECT_GE(double(same), 0.95 * double(N));
  }
  std::printf("own selections: loss cpu %.6f gpu %.6f\n", loss_cpu, loss_gpu);
  EXPECT_NEAR(loss_gpu, loss_cpu, 2e-2 * std::abs(loss_cpu));
}

}  // namespace
