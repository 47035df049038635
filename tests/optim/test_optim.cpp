// Optimisers against independent double-precision reimplementations of the formulas (design §5).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/dsv4/balance.h"
#include "model/dsv4/moe.h"
#include "optim/optimizer.h"
#include "optim/param_groups.h"
#include "optim/schedule.h"
#include "optim/update_rules.h"

using namespace trex;
using namespace trex::optim;
using Mat = std::vector<std::vector<double>>;

static Mat matmul(const Mat& a, const Mat& b) {
  Mat c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}
static Mat transpose(const Mat& a) {
  Mat t(a[0].size(), std::vector<double>(a.size()));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  return t;
}

// Reference NS written directly from the formula X <- aX + b(XX^T)X + c(XX^T)^2 X on the matrix as given
// (no transposition trick), in double.
static Mat reference_ns(Mat x) {
  double norm = 0;
  for (auto& r : x)
    for (double v : r) norm += v * v;
  norm = std::sqrt(norm) + 1e-7;
  for (auto& r : x)
    for (double& v : r) v /= norm;
  for (int it = 0; it < 10; ++it) {
    double a = it < 8 ? 3.4445 : 2.0, b = it < 8 ? -4.7750 : -1.5, c = it < 8 ? 2.0315 : 0.5;
    Mat g = matmul(x, transpose(x));
    Mat gx = matmul(g, x), ggx = matmul(g, gx);
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t j = 0; j < x[0].size(); ++j) x[i][j] = a * x[i][j] + b * gx[i][j] + c * ggx[i][j];
  }
  return x;
}

TEST(AdamW, MatchesDoubleReferenceOverSeveralSteps) {
  const std::vector<double> g1 = {0.5, -1.0, 2.0, 0.0, 1e-3, -0.25}, g2 = {-0.1, 0.3, 0.2, 1.0, -2.0, 0.7};
  std::vector<float> w = {1, -2, 0.5, 3, -0.1, 0.0}, m(6, 0), v(6, 0);
  std::vector<double> rw(w.begin(), w.end()), rm(6, 0), rv(6, 0);
  AdamWConfig c;
  c.beta1 = 0.9, c.beta2 = 0.95, c.eps = 1e-8, c.weight_decay = 0.1;
  const double lr = 0.01;
  for (int step = 1; step <= 3; ++step) {
    const auto& g = step % 2 ? g1 : g2;
    std::vector<float> gf(g.begin(), g.end());
    adamw_update(w.data(), gf.data(), m.data(), v.data(), 6, lr, c, step, true);
    for (int i = 0; i < 6; ++i) {
      rw[i] *= 1 - lr * c.weight_decay;
      rm[i] = 0.9 * rm[i] + 0.1 * g[i];
      rv[i] = 0.95 * rv[i] + 0.05 * g[i] * g[i];
      double mh = rm[i] / (1 - std::pow(0.9, step)), vh = rv[i] / (1 - std::pow(0.95, step));
      rw[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
    }
  }
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(w[i], rw[i], 1e-6) << i;
  // First step moves every coordinate with a non-zero gradient by about lr (Adam's sign-like step).
  EXPECT_NEAR(std::abs(rw[0] - 1.0 * std::pow(0.999, 3)), 0.03, 0.02);
}

TEST(Muon, NewtonSchulzMatchesReferenceOn3x2And2x3) {
  Mat g = {{0.3, -1.2}, {0.8, 0.5}, {-0.4, 0.9}};
  for (bool tall : {true, false}) {
    Mat x = tall ? g : transpose(g);
    Mat ref = reference_ns(x);
    std::vector<float> buf;
    for (auto& r : x)
      for (double v : r) buf.push_back(float(v));
    std::vector<float> work;
    newton_schulz(buf.data(), int64_t(x.size()), int64_t(x[0].size()), MuonConfig{}, work);
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t j = 0; j < x[0].size(); ++j) EXPECT_NEAR(buf[i * x[0].size() + j], ref[i][j], 2e-5);
  }
}

TEST(Muon, NewtonSchulzOutputIsNearOrthogonal) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int rows = 24, cols = 40;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = nd(rng) * 5.0f;
  std::vector<float> work;
  newton_schulz(x.data(), rows, cols, MuonConfig{}, work);
  // X X^T should be close to the identity (all singular values near 1).
  double max_dev = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < rows; ++j) {
      double s = 0;
      for (int k = 0; k < cols; ++k) s += double(x[i * cols + k]) * x[j * cols + k];
      max_dev = std::max(max_dev, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  EXPECT_LT(max_dev, 0.1);
}

TEST(Muon, FullUpdateMatchesReference) {
  // Two steps of Muon on a 3x2 weight: Nesterov momentum, NS, RMS scaling 0.18*sqrt(3), decoupled decay.
  Mat w0 = {{0.1, 0.2}, {-0.3, 0.4}, {0.5, -0.6}};
  Mat ga = {{0.3, -1.2}, {0.8, 0.5}, {-0.4, 0.9}}, gb = {{-0.2, 0.1}, {0.05, 0.7}, {0.6, -0.3}};
  std::vector<float> w, mom(6, 0), work;
  for (auto& r : w0)
    for (double v : r) w.push_back(float(v));
  Mat rw = w0, rm(3, std::vector<double>(2, 0.0));
  const double lr = 0.02, mu = 0.95, wd = 0.1;
  for (int step = 0; step < 2; ++step) {
    const Mat& g = step == 0 ? ga : gb;
    std::vector<float> gf;
    for (auto& r : g)
      for (double v : r) gf.push_back(float(v));
    muon_update(w.data(), gf.data(), mom.data(), 3, 2, lr, MuonConfig{}, work);
    Mat in(3, std::vector<double>(2));
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) {
        rm[i][j] = mu * rm[i][j] + g[i][j];
        in[i][j] = mu * rm[i][j] + g[i][j];
      }
    Mat o = reference_ns(in);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) rw[i][j] = rw[i][j] * (1 - lr * wd) - lr * 0.18 * std::sqrt(3.0) * o[i][j];
  }
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) EXPECT_NEAR(w[i * 2 + j], rw[i][j], 1e-6);
}

TEST(Optimizer, UpdateRmsIsPointEighteenForMuonAndStackedMatricesAreIndependent) {
  // A [2, 16, 32] tensor is two matrices; each gets its own orthogonalisation, so each slice's update RMS
  // is 0.18 * lr regardless of the other slice's gradient scale.
  std::vector<float> w(2 * 16 * 32, 0.0f), g(w.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < g.size(); ++i) g[i] = nd(rng) * (i < g.size() / 2 ? 1.0f : 1000.0f);
  OptimizerConfig cfg;
  cfg.muon.weight_decay = 0;
  Optimizer opt({{"layers.0.ffn.experts.w1", {2, 16, 32}, w.data(), g.data(), ParamGroup::Muon}}, cfg);
  opt.step(1.0);
  for (int k = 0; k < 2; ++k) {
    double ss = 0;
    for (int i = 0; i < 512; ++i) ss += double(w[k * 512 + i]) * w[k * 512 + i];
    // Orthogonal 16x32 O has RMS 1/sqrt(32); times sqrt(32) * 0.18 gives 0.18 (NS leaves sigma ~ 1).
    EXPECT_NEAR(std::sqrt(ss / 512), 0.18, 0.02) << k;
  }
}

TEST(Optimizer, ClipByGlobalNormAndGroupsSkipFrozen) {
  std::vector<float> a = {3, 0}, ga = {3, 0}, b = {1}, gb = {4}, c = {5}, gc = {100};
  OptimizerConfig cfg;
  cfg.clip_grad_norm = 1.0;
  Optimizer opt({{"x", {2}, a.data(), ga.data(), ParamGroup::AdamW},
                 {"y", {1}, b.data(), gb.data(), ParamGroup::AdamW},
                 {"z", {1}, c.data(), gc.data(), ParamGroup::Frozen}},
                cfg);
  EXPECT_NEAR(opt.grad_norm(), 5.0, 1e-9);  // frozen z's gradient is not counted
  EXPECT_NEAR(opt.clip_gradients(), 5.0, 1e-9);
  EXPECT_NEAR(ga[0], 0.6, 1e-5);
  EXPECT_NEAR(gb[0], 0.8, 1e-5);
  EXPECT_NEAR(opt.grad_norm(), 1.0, 1e-5);
  opt.step(0.1);
  EXPECT_EQ(c[0], 5.0f);
  EXPECT_NE(b[0], 1.0f);
  EXPECT_EQ(opt.state_tensors().size(), 4u);  // exp_avg + exp_avg_sq for x and y only
}

TEST(ParamGroups, Dsv4AssignmentByOfficialName) {
  EXPECT_EQ(dsv4_param_group("embed.weight", {100, 8}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("head.weight", {100, 8}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("norm.weight", {8}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.3.attn.q_norm.weight", {8}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.3.attn.compressor.norm.weight", {8}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("mtp.0.enorm.weight", {8}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.0.hc_attn_base", {24}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.0.hc_ffn_scale", {3}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("hc_head_base", {4}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.0.attn.attn_sink", {64}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.2.attn.compressor.ape", {4, 1024}), ParamGroup::AdamW);
  EXPECT_EQ(dsv4_param_group("layers.0.hc_attn_fn", {24, 64}), ParamGroup::Muon);
  EXPECT_EQ(dsv4_param_group("hc_head_fn", {4, 64}), ParamGroup::Muon);
  EXPECT_EQ(dsv4_param_group("layers.5.ffn.gate.weight", {16, 8}), ParamGroup::Muon);
  EXPECT_EQ(dsv4_param_group("layers.5.ffn.experts.3.w2.weight", {8, 16}), ParamGroup::Muon);
  EXPECT_EQ(dsv4_param_group("layers.5.attn.wq_a.weight", {16, 8}), ParamGroup::Muon);
  EXPECT_EQ(dsv4_param_group("layers.5.ffn.gate.bias", {16}), ParamGroup::Buffer);
  EXPECT_EQ(dsv4_param_group("layers.0.ffn.gate.tid2eid", {100, 6}), ParamGroup::Buffer);
}

TEST(ParamGroups, FreezeByGlobAndUnknownPatternIsAnError) {
  float x = 0, g = 0;
  std::vector<ParamRef> ps = {{"embed.weight", {1}, &x, &g, ParamGroup::AdamW},
                              {"layers.2.attn.indexer.wq_b.weight", {1, 1}, &x, &g, ParamGroup::Muon},
                              {"layers.2.attn.wq_a.weight", {1, 1}, &x, &g, ParamGroup::Muon}};
  apply_freeze(ps, {"embed.weight", "layers.*.attn.indexer.*"});
  EXPECT_EQ(ps[0].group, ParamGroup::Frozen);
  EXPECT_EQ(ps[1].group, ParamGroup::Frozen);
  EXPECT_EQ(ps[2].group, ParamGroup::Muon);
  EXPECT_THROW(apply_freeze(ps, {"layers.*.nonexistent"}), Error);
}

TEST(Schedule, WarmupThenCosineLinearConstant) {
  ScheduleConfig c;
  c.lr = 1.0, c.min_lr = 0.1, c.warmup_steps = 4, c.total_steps = 14;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 1.0);
  EXPECT_NEAR(lr_at(c, 9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(c, 14), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(c, 100), 0.1);
  c.kind = "linear";
  EXPECT_NEAR(lr_at(c, 9), 0.55, 1e-12);
  c.kind = "cosine", c.decay_start = 10;  // warm-up, constant plateau, then cosine (the DeepSeek-V4 shape)
  EXPECT_DOUBLE_EQ(lr_at(c, 8), 1.0);
  EXPECT_NEAR(lr_at(c, 12), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(mtp_weight_at(c, 9), 0.3);
  EXPECT_DOUBLE_EQ(mtp_weight_at(c, 10), 0.1);
  c.kind = "constant";
  EXPECT_DOUBLE_EQ(lr_at(c, 13), 1.0);
  EXPECT_THROW(parse_schedule_config({{"kind", "exp"}}, "cfg.yaml"), Error);
}

TEST(LoadBalance, RouterBiasMovesTowardsMeanLoad) {
  // The model's update (dsv4::router_bias_update), which the trainer calls after each optimiser step.
  std::vector<float> bias = {0, 0, 0, 0};
  std::vector<int64_t> load = {10, 2, 4, 4};  // mean 5
  dsv4::router_bias_update(bias.data(), load.data(), 4, 0.001);
  EXPECT_FLOAT_EQ(bias[0], -0.001f);
  EXPECT_FLOAT_EQ(bias[1], 0.001f);
  EXPECT_FLOAT_EQ(bias[2], 0.001f);
  std::vector<int64_t> even = {5, 5};
  dsv4::router_bias_update(bias.data(), even.data(), 2, 0.001);
  EXPECT_FLOAT_EQ(bias[0], -0.001f);  // exactly at the mean: unchanged
}

TEST(LoadBalance, SequenceLossValueAndGradientByFiniteDifferences) {
  const int T = 3, E = 4, K = 2;
  std::vector<float> s = {0.5, 1.0, 0.2, 0.3, 0.9, 0.1, 0.4, 0.6, 0.3, 0.3, 0.8, 0.2};
  std::vector<int32_t> sel = {1, 0, 0, 3, 2, 0};
  // By hand: counts e0:3, e1:1, e2:1, e3:1 -> f = E/(K T) * c = (2, 2/3, 2/3, 2/3).
  double f[4] = {2, 2.0 / 3, 2.0 / 3, 2.0 / 3}, p[4] = {0, 0, 0, 0};
  for (int t = 0; t < T; ++t) {
    double S = 0;
    for (int e = 0; e < E; ++e) S += s[t * E + e];
    for (int e = 0; e < E; ++e) p[e] += s[t * E + e] / S / T;
  }
  double expect = 0;
  for (int e = 0; e < E; ++e) expect += 1e-4 * f[e] * p[e];
  std::vector<float> grad(T * E, 0.0f);
  EXPECT_NEAR(dsv4::balance_loss<float>(s.data(), sel.data(), 1, T, E, K, 1e-4, grad.data()), expect, 1e-12);
  for (int i = 0; i < T * E; ++i) {
    auto sp = s, sm = s;
    const float h = 1e-2f;
    sp[i] += h, sm[i] -= h;
    double fd = (dsv4::balance_loss<float>(sp.data(), sel.data(), 1, T, E, K, 1.0, nullptr) -
                 dsv4::balance_loss<float>(sm.data(), sel.data(), 1, T, E, K, 1.0, nullptr)) / (2 * h);
    EXPECT_NEAR(grad[i] / 1e-4, fd, 1e-3 * std::max(1.0, std::abs(fd))) << i;
  }
}
