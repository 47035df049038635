// Whole-model checks on a micro config in double: finite differences of the total loss (LM + MTP + balance)
// against backward() for random entries of every kind of parameter, and basic invariants of the assembly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/dsv4/model.h"
#include "model/model_test_util.h"

using namespace trex::dsv4;
using trex::dsv4::test::init_random;

namespace {

ModelConfig micro_config() {
  ModelConfig c;
  c.vocab_size = 16, c.hidden = 8, c.n_layers = 3, c.n_heads = 2, c.head_dim = 8, c.rope_dim = 4;
  c.q_lora_rank = 8, c.o_groups = 2, c.o_lora_rank = 4, c.window = 4;
  c.index_n_heads = 2, c.index_head_dim = 4, c.index_topk = 2;
  c.n_routed_experts = 4, c.n_shared_experts = 1, c.topk = 2, c.moe_inter = 4;
  c.routed_scale = 1.5, c.swiglu_limit = 1.2, c.hc_mult = 3, c.hc_sinkhorn_iters = 20, c.n_mtp = 1;
  c.max_position = 64;
  c.attn_types = {AttnType::Sliding, AttnType::CSA, AttnType::HCA};
  c.compress_ratio = {0, 4, 8};
  c.mlp_types = {MlpType::HashMoE, MlpType::MoE, MlpType::MoE};
  c.rope_main.theta = 10000;
  c.rope_compress.theta = 160000, c.rope_compress.yarn = true, c.rope_compress.factor = 4;
  c.rope_compress.original_max_position = 16;
  c.validate();
  return c;
}


}  // namespace

TEST(ModelFd, TotalLossGradientMatchesFiniteDifferences) {
  const ModelConfig cfg = micro_config();
  ModelOptions opts;
  opts.balance_alpha = 0.05;
  opts.mtp_weight = 0.3;
  Model<double> m(cfg, opts);
  ASSERT_TRUE(m.has_mtp());
  init_random(m, 5);
  const int64_t B = 2, S = 20;
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int> ut(0, int(cfg.vocab_size) - 1);
  std::vector<int32_t> ids(size_t(B * S)), labels(size_t(B * S));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = ut(rng), labels[i] = ids[i];
  for (int s = 0; s < 5; ++s) labels[size_t(s)] = -100;  // an unlabelled prompt span in row 0
  // Row 0 one document, row 1 two packed documents (12 + 8).
  const SeqLayout layout = SeqLayout::packed(S, {{S}, {12, 8}});
  const double loss = m.forward(ids.data(), labels.data(), layout);
  const LossParts parts = m.loss_parts();
  EXPECT_GT(parts.lm, 0.0);
  EXPECT_GT(parts.mtp, 0.0);
  EXPECT_GT(parts.balance, 0.0);
  EXPECT_NEAR(loss, parts.lm + 0.3 * parts.mtp + parts.balance, 1e-12);
  // Row 0: positions 4..18 predict labelled tokens 5..19 (15); row 1: 19 pairs minus the one crossing the
  // document boundary at 12 (18).
  EXPECT_EQ(parts.lm_targets, 15 + 18);
  // MTP (t predicts t+2): row 0 positions 3..17 (15); row 1: 10 + 6 inside the two documents (16).
  EXPECT_EQ(parts.mtp_targets, 15 + 16);
  m.params().zero_grads();
  m.backward();

  // Check a few random entries of every parameter tensor with a non-trivial role.
  auto& P = m.params();
  std::vector<std::pair<const ParamInfo*, int64_t>> picks;
  std::uniform_real_distribution<double> uu(0.0, 1.0);
  for (const auto& p : P.entries()) {
    if (!p.lm_grad) continue;
    for (int k = 0; k < 2; ++k) picks.push_back({&p, int64_t(uu(rng) * double(p.numel)) % p.numel});
  }
  const double h = 1e-6;
  int checked = 0, nonzero = 0;
  double worst = 0;
  std::string worst_name;
  for (auto [p, i] : picks) {
    double* v = P.arena_value(*p) + i;
    const double analytic = P.arena_grad(*p)[i];
    const double v0 = *v;
    *v = v0 + h;
    const double lp = m.forward(ids.data(), labels.data(), layout);
    *v = v0 - h;
    const double lm = m.forward(ids.data(), labels.data(), layout);
    *v = v0;
    const double num = (lp - lm) / (2 * h);
    const double err = std::fabs(num - analytic) / std::max({std::fabs(num), std::fabs(analytic), 1e-4});
    if (err > worst) worst = err, worst_name = p->name;
    EXPECT_LT(err, 1e-4) << p->name << "[" << i << "] analytic " << analytic << " numeric " << num;
    ++checked;
    nonzero += std::fabs(num) > 1e-8;
  }
  EXPECT_GT(nonzero, checked / 2) << "most checked derivatives are zero: the check is too weak";
  RecordProperty("worst_rel_err", std::to_string(worst) + " at " + worst_name);
  // The indexer's parameters get no gradient from the LM loss.
  for (const auto& p : P.entries())
    if (!p.lm_grad)
      for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(P.arena_grad(p)[i], 0.0) << p.name;
}

TEST(ModelFd, ExpertLoadCountsEveryRoutedSlot) {
  const ModelConfig cfg = micro_config();
  Model<double> m(cfg, ModelOptions{});
  init_random(m, 6);
  const int64_t B = 1, S = 16;
  std::vector<int32_t> ids(static_cast<size_t>(S)), labels(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) ids[size_t(s)] = labels[size_t(s)] = (s * 7) % 16;
  m.forward(ids.data(), labels.data(), SeqLayout::unpacked(B, S));
  ASSERT_EQ(m.n_blocks(), 4);  // 3 layers + MTP
  for (int64_t l = 0; l < m.n_blocks(); ++l) {
    int64_t total = 0;
    for (auto c : m.expert_load(l)) total += c;
    EXPECT_EQ(total, S * cfg.topk) << "block " << l;
  }
}

TEST(ModelFd, RejectsBadInput) {
  const ModelConfig cfg = micro_config();
  Model<double> m(cfg, ModelOptions{});
  init_random(m, 7);
  std::vector<int32_t> ids(8, 3), labels(8, 3);
  ids[2] = 99;  // outside the vocabulary
  EXPECT_THROW(m.forward(ids.data(), labels.data(), SeqLayout::unpacked(1, 8)), trex::Error);
  std::map<std::string, trex::HostTensor> empty;
  EXPECT_THROW(m.load(empty), trex::Error);
}
