// Packing equivalence for the whole model (design §2.11): documents packed into one row give the same loss and
// the same gradients as running each document alone (positions restart, windows, compressors and the indexer
// stop at document starts). The loss is one mean over all labelled targets, so the packed loss equals the
// target-weighted mean of the separate losses, and likewise for every gradient. The balance loss is per row
// (packing changes a row's statistics by design) and MTP is not used here; both are covered by test_model_fd.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/dsv4/model.h"
#include "model/model_test_util.h"

using namespace trex::dsv4;
using trex::dsv4::test::init_random;

namespace {

ModelConfig packing_config() {
  ModelConfig c;
  c.vocab_size = 24, c.hidden = 8, c.n_layers = 3, c.n_heads = 2, c.head_dim = 8, c.rope_dim = 4;
  c.q_lora_rank = 8, c.o_groups = 2, c.o_lora_rank = 4, c.window = 5;
  c.index_n_heads = 2, c.index_head_dim = 4, c.index_topk = 2;
  c.n_routed_experts = 4, c.n_shared_experts = 1, c.topk = 2, c.moe_inter = 4;
  c.routed_scale = 1.5, c.swiglu_limit = 10.0, c.hc_mult = 4, c.hc_sinkhorn_iters = 20, c.n_mtp = 0;
  c.max_position = 64;
  c.attn_types = {AttnType::CSA, AttnType::HCA, AttnType::Sliding};
  c.compress_ratio = {4, 8, 0};
  c.mlp_types = {MlpType::HashMoE, MlpType::MoE, MlpType::MoE};
  c.rope_main.theta = 10000;
  c.rope_compress.theta = 160000, c.rope_compress.yarn = true, c.rope_compress.factor = 4;
  c.rope_compress.original_max_position = 16;
  c.validate();
  return c;
}


std::vector<double> grads_of(Model<double>& m) {
  std::vector<double> g;
  auto& P = m.params();
  for (const auto& p : P.entries()) {
    const double* d = P.arena_grad(p);
    g.insert(g.end(), d, d + p.numel);
  }
  return g;
}

}  // namespace

TEST(ModelPacking, PackedDocumentsEqualSeparateRuns) {
  const ModelConfig cfg = packing_config();
  ModelOptions opts;
  opts.balance_alpha = 0.0;
  opts.use_mtp = false;
  Model<double> m(cfg, opts);
  init_random(m, 11);

  // Lengths that fill no compression window evenly (rates 4 and 8), one shorter than the window.
  const std::vector<int64_t> lengths = {13, 18, 4, 11};
  int64_t T = 0;
  for (auto l : lengths) T += l;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int> ut(0, int(cfg.vocab_size) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) ids[size_t(i)] = ut(rng), labels[size_t(i)] = ids[size_t(i)];
  labels[2] = -100;  // an unlabelled token inside the first document

  // Packed: one row.
  m.params().zero_grads();
  const double packed_loss = m.forward(ids.data(), labels.data(), SeqLayout::packed(T, {lengths}));
  const int64_t packed_targets = m.loss_parts().lm_targets;
  m.backward();
  const std::vector<double> packed_grad = grads_of(m);

  // Separate: each document alone, combined with the weights n_i / N of its target count.
  double loss_sum = 0;
  int64_t targets = 0;
  std::vector<double> grad_sum(packed_grad.size(), 0.0);
  int64_t start = 0;
  for (auto len : lengths) {
    m.params().zero_grads();
    const double loss = m.forward(ids.data() + start, labels.data() + start, SeqLayout::unpacked(1, len));
    const int64_t n = m.loss_parts().lm_targets;
    m.backward();
    const std::vector<double> g = grads_of(m);
    loss_sum += loss * double(n);
    for (size_t i = 0; i < g.size(); ++i) grad_sum[i] += g[i] * double(n);
    targets += n;
    start += len;
  }
  ASSERT_EQ(targets, packed_targets);
  // Every document of length L predicts L-1 tokens; one label is masked.
  EXPECT_EQ(targets, T - int64_t(lengths.size()) - 1);
  EXPECT_NEAR(packed_loss, loss_sum / double(targets), 1e-12);
  double num = 0, den = 0;
  for (size_t i = 0; i < grad_sum.size(); ++i) {
    const double sep = grad_sum[i] / double(targets);
    num += (packed_grad[i] - sep) * (packed_grad[i] - sep);
    den += sep * sep;
  }
  ASSERT_GT(den, 0.0);
  EXPECT_LT(std::sqrt(num / den), 1e-10);
}
