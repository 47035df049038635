// Dsv4Stage through the parallel::PipelineStage interface: the model split into 3 stages built from the same seed
// as a Dsv4Trainable (so the stages hold exactly the whole model's initial values), a step of 3 micro-batches run
// in 1F1B order, gives the trainer's step: mean loss, gradients accumulated and scaled by 1/n_micro (the MTP's copy
// of embed.weight summed over its two holders), expert loads and the router-bias update.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "model/dsv4/partition.h"
#include "parallel/pipeline_stage.h"
#include "train/dsv4_stage.h"
#include "train/dsv4_trainable.h"

using namespace trex;
using namespace trex::train;

namespace {

dsv4::ModelConfig stage_config() {
  dsv4::ModelConfig c;
  c.vocab_size = 20, c.hidden = 8, c.n_layers = 4, c.n_heads = 2, c.head_dim = 8, c.rope_dim = 4;
  c.q_lora_rank = 8, c.o_groups = 2, c.o_lora_rank = 4, c.window = 4;
  c.index_n_heads = 2, c.index_head_dim = 4, c.index_topk = 2;
  c.n_routed_experts = 4, c.n_shared_experts = 1, c.topk = 2, c.moe_inter = 4;
  c.routed_scale = 1.5, c.swiglu_limit = 1.2, c.hc_mult = 3, c.hc_sinkhorn_iters = 20, c.n_mtp = 1;
  c.max_position = 64;
  c.attn_types = {dsv4::AttnType::CSA, dsv4::AttnType::Sliding, dsv4::AttnType::HCA, dsv4::AttnType::Sliding};
  c.compress_ratio = {4, 0, 8, 0};
  c.mlp_types = {dsv4::MlpType::HashMoE, dsv4::MlpType::MoE, dsv4::MlpType::MoE, dsv4::MlpType::MoE};
  c.rope_main.theta = 10000;
  c.rope_compress.theta = 160000, c.rope_compress.yarn = true, c.rope_compress.factor = 4;
  c.rope_compress.original_max_position = 16;
  c.validate();
  return c;
}

Dsv4TrainOptions stage_options() {
  Dsv4TrainOptions o;
  o.init_std = 0.3;              // large enough that every term of the loss moves
  o.model.balance_alpha = 0.05;  // the balance loss is a visible share of the gradient
  o.model.mtp_weight = 0.3;
  o.bias_update_speed = 1e-2;
  return o;
}

// Micro-batches of 2 rows x 16 tokens with packed documents (doc_start flags, positions restarting) and a few
// unlabelled tokens.
std::vector<data::Batch> make_batches(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> ut(0, int(vocab) - 1);
  std::vector<data::Batch> out;
  for (int64_t m = 0; m < n; ++m) {
    data::Batch b;
    b.batch = 2, b.seq = 16;
    const size_t N = 32;
    b.input_ids.resize(N), b.labels.resize(N), b.pos.resize(N), b.doc_start.assign(N, 0);
    for (size_t i = 0; i < N; ++i) b.input_ids[i] = ut(rng);
    const std::vector<int64_t> starts[2] = {{0, 5 + m}, {0, 9 - m, 12}};
    for (int r = 0; r < 2; ++r) {
      for (int64_t s : starts[r]) b.doc_start[size_t(r * 16 + s)] = 1;
      int32_t pos = 0;
      for (int t = 0; t < 16; ++t) {
        const size_t i = size_t(r * 16 + t);
        if (b.doc_start[i]) pos = 0;
        b.pos[i] = pos++;
        b.labels[i] = b.doc_start[i] ? -1 : b.input_ids[i];  // aligned with the ids (data/batch.h)
      }
    }
    b.labels[size_t(2 + m)] = -1;
    for (int32_t l : b.labels) b.n_targets += l != -1;
    out.push_back(std::move(b));
  }
  return out;
}

// 1F1B in dependency order over the PipelineStage interface only, boundary tensors passed by hand.
double run_1f1b(std::vector<parallel::PipelineStage*>& st, int64_t M) {
  const int64_t P = int64_t(st.size());
  struct Op {
    bool fwd;
    int64_t m;
  };
  std::vector<std::vector<Op>> ops(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) {
    int64_t f = 0, b = 0;
    for (; f < std::min(P - 1 - i, M); ++f) ops[size_t(i)].push_back({true, f});
    while (f < M) ops[size_t(i)].push_back({true, f++}), ops[size_t(i)].push_back({false, b++});
    while (b < M) ops[size_t(i)].push_back({false, b++});
  }
  std::vector<std::vector<std::vector<float>>> x(static_cast<size_t>(P), std::vector<std::vector<float>>(static_cast<size_t>(M)));
  auto dx = x;
  std::vector<std::vector<char>> fd(size_t(P), std::vector<char>(size_t(M), 0)), bd = fd;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  double loss = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t i = 0; i < P; ++i) {
      if (next[size_t(i)] == ops[size_t(i)].size()) continue;
      const Op op = ops[size_t(i)][next[size_t(i)]];
      const size_t m = size_t(op.m);
      EXPECT_EQ(st[size_t(i)]->is_first(), i == 0);
      EXPECT_EQ(st[size_t(i)]->is_last(), i == P - 1);
      const int64_t n = st[size_t(i)]->boundary_elems();
      if (op.fwd) {
        if (i > 0 && !fd[size_t(i - 1)][m]) continue;
        float* out = nullptr;
        if (i + 1 < P) x[size_t(i)][m].assign(size_t(n), 0.f), out = x[size_t(i)][m].data();
        loss += st[size_t(i)]->forward(op.m, i > 0 ? x[size_t(i - 1)][m].data() : nullptr, out);
        fd[size_t(i)][m] = 1;
      } else {
        if (i + 1 < P ? !bd[size_t(i + 1)][m] : !fd[size_t(i)][m]) continue;
        float* din = nullptr;
        if (i > 0) dx[size_t(i - 1)][m].assign(size_t(n), 0.f), din = dx[size_t(i - 1)][m].data();
        st[size_t(i)]->backward(op.m, i + 1 < P ? dx[size_t(i)][m].data() : nullptr, din);
        bd[size_t(i)][m] = 1;
      }
      ++next[size_t(i)];
      progress = true;
    }
  }
  for (int64_t i = 0; i < P; ++i) EXPECT_EQ(next[size_t(i)], ops[size_t(i)].size()) << "stage " << i << " stalled";
  return loss;
}

double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den == 0 ? num : num / den;
}

}  // namespace

TEST(Dsv4Stage, ThreeStagesThroughPipelineInterfaceMatchTheTrainerStep) {
  const dsv4::ModelConfig cfg = stage_config();
  const Dsv4TrainOptions opts = stage_options();
  const uint64_t seed = 41;
  const int64_t M = 3;
  const auto batches = make_batches(M, cfg.vocab_size, 7);

  // The trainer's step on the whole model: grads accumulated over the micro-batches, then scaled by 1/M.
  Dsv4Trainable whole(cfg, opts, seed);
  std::map<std::string, optim::ParamRef> wref;
  for (auto& p : whole.params()) wref[p.name] = p;
  whole.zero_grads();
  double mean_loss = 0;
  for (const auto& b : batches) mean_loss += whole.forward_backward(b).loss / double(M);
  for (auto& [name, p] : wref)
    if (p.grad)
      for (int64_t i = 0; i < p.numel(); ++i) p.grad[i] *= float(1.0 / double(M));

  const auto parts = dsv4::split_layers(cfg, 3);
  std::vector<std::unique_ptr<Dsv4Stage>> stages;
  std::vector<parallel::PipelineStage*> iface;
  for (size_t i = 0; i < parts.size(); ++i) {
    stages.push_back(std::make_unique<Dsv4Stage>(cfg, parts[i], opts, seed, int64_t(parts.size() - i)));
    iface.push_back(stages.back().get());
  }
  // Same seed, any split: every tensor and buffer starts with the whole model's value.
  std::map<std::string, int> holders;
  for (auto& st : stages) {
    for (auto& p : st->params()) {
      ++holders[p.name];
      ASSERT_TRUE(wref.count(p.name)) << p.name;
      const optim::ParamRef& w = wref[p.name];
      ASSERT_EQ(w.shape, p.shape) << p.name;
      ASSERT_EQ(std::memcmp(w.value, p.value, size_t(p.numel()) * sizeof(float)), 0) << p.name << " initialised differently";
    }
    for (const auto& [name, t] : st->model().params().tid2eid)
      EXPECT_EQ(t, whole.model().params().tid2eid.at(name)) << name;
  }
  EXPECT_EQ(holders.size(), wref.size());
  EXPECT_EQ(stages.front()->shared_params(), std::vector<std::string>{"embed.weight"});
  EXPECT_EQ(stages.back()->shared_params(), std::vector<std::string>{"embed.weight"});
  EXPECT_TRUE(stages[1]->shared_params().empty());

  for (auto& st : stages) st->zero_grads(), st->set_step_batches(batches);
  const double loss = run_1f1b(iface, M);
  EXPECT_NEAR(loss, mean_loss, 1e-5 * mean_loss);
  double stats_loss = 0;
  for (auto& st : stages) stats_loss += st->step_stats().loss;
  EXPECT_NEAR(stats_loss, loss, 1e-12 * loss);
  EXPECT_GT(stages.back()->step_stats().parts.at("mtp"), 0.0);

  // Gradients by name, shared copies summed.
  std::map<std::string, std::vector<float>> got;
  for (auto& st : stages)
    for (auto& p : st->params()) {
      if (!p.grad) continue;
      auto& g = got[p.name];
      if (g.empty()) g.assign(size_t(p.numel()), 0.f);
      for (int64_t i = 0; i < p.numel(); ++i) g[size_t(i)] += p.grad[i];
    }
  double worst = 0;
  for (auto& [name, w] : wref) {
    if (!w.grad) continue;
    EXPECT_EQ(holders[name], name == "embed.weight" ? 2 : 1) << name;
    const double e = rel_err(got[name].data(), w.grad, w.numel());
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-5) << name;
  }
  RecordProperty("worst_rel_err", std::to_string(worst));

  // Expert loads by block, then the router-bias update: the same biases as the whole model's.
  const auto& wl = whole.expert_load_sums();
  for (auto& st : stages)
    for (int64_t l = 0; l < st->model().n_blocks(); ++l) {
      const std::string& pre = st->model().block_prefix(l);
      const int64_t wl_index = pre == "mtp.0." ? cfg.n_layers : std::stoll(pre.substr(7));
      EXPECT_EQ(st->expert_load_sums()[size_t(l)], wl[size_t(wl_index)]) << pre;
    }
  whole.after_optimizer_step();
  int64_t biases = 0;
  for (auto& st : stages) {
    st->after_optimizer_step();
    for (auto& p : st->params())
      if (p.group == optim::ParamGroup::Buffer) {
        ++biases;
        EXPECT_EQ(std::memcmp(p.value, wref[p.name].value, size_t(p.numel()) * sizeof(float)), 0) << p.name;
      }
  }
  EXPECT_EQ(biases, 4);  // layers 1..3 and the MTP block are score-routed
}

TEST(Dsv4Stage, RejectsSlotConflictsAndStrayBackwards) {
  const dsv4::ModelConfig cfg = stage_config();
  const auto parts = dsv4::split_layers(cfg, 2);
  Dsv4Stage first(cfg, parts[0], stage_options(), 1, /*n_slots=*/1);
  EXPECT_THROW(first.boundary_elems(), trex::Error);  // no batches yet
  const auto batches = make_batches(2, cfg.vocab_size, 3);
  first.set_step_batches(batches);
  EXPECT_EQ(first.boundary_elems(), 2 * 16 * cfg.hc_mult * cfg.hidden);
  std::vector<float> x0(static_cast<size_t>(first.boundary_elems())), x1 = x0;
  first.forward(0, nullptr, x0.data());
  EXPECT_THROW(first.forward(1, nullptr, x1.data()), trex::Error);  // one slot, still held by micro-batch 0
  EXPECT_THROW(first.backward(1, x1.data(), nullptr), trex::Error);  // micro-batch 1 is not in flight
  EXPECT_THROW(first.set_step_batches(batches), trex::Error);        // micro-batch 0 still in flight
  first.backward(0, x0.data(), nullptr);
  first.forward(1, nullptr, x1.data());  // the slot is free again
  EXPECT_THROW(first.forward(2, nullptr, x1.data()), trex::Error);  // the step has 2 micro-batches
}
