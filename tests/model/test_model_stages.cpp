// Pipeline-stage partitioning of the CPU model: the model split into 2, 3 or 4 stages (weights copied by name from
// the whole model), several micro-batches run in 1F1B order through the chain with boundary streams passed by
// hand, gives the whole model's losses and the gradients the trainer accumulates (sum of micro-batch gradients
// scaled by 1/n_micro), per tensor, with the MTP's copy of embed.weight summed over the stages holding it.
// fp32, a tiny config with a hash layer, score layers, sliding/CSA/HCA attention, MTP, the balance loss and
// packed documents.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "model/dsv4/model.h"
#include "model/dsv4/partition.h"

using namespace trex::dsv4;

namespace {

ModelConfig stage_config() {
  ModelConfig c;
  c.vocab_size = 20, c.hidden = 8, c.n_layers = 4, c.n_heads = 2, c.head_dim = 8, c.rope_dim = 4;
  c.q_lora_rank = 8, c.o_groups = 2, c.o_lora_rank = 4, c.window = 4;
  c.index_n_heads = 2, c.index_head_dim = 4, c.index_topk = 2;
  c.n_routed_experts = 4, c.n_shared_experts = 1, c.topk = 2, c.moe_inter = 4;
  c.routed_scale = 1.5, c.swiglu_limit = 1.2, c.hc_mult = 3, c.hc_sinkhorn_iters = 20, c.n_mtp = 1;
  c.max_position = 64;
  c.attn_types = {AttnType::CSA, AttnType::Sliding, AttnType::HCA, AttnType::Sliding};
  c.compress_ratio = {4, 0, 8, 0};
  c.mlp_types = {MlpType::HashMoE, MlpType::MoE, MlpType::MoE, MlpType::MoE};
  c.rope_main.theta = 10000;
  c.rope_compress.theta = 160000, c.rope_compress.yarn = true, c.rope_compress.factor = 4;
  c.rope_compress.original_max_position = 16;
  c.validate();
  return c;
}

ModelOptions stage_options() {
  ModelOptions o;
  o.balance_alpha = 0.05;  // large enough that a missing or double-counted layer term shows
  o.mtp_weight = 0.3;
  return o;
}

// Norm weights near 1, everything else N(0, 0.3^2); router biases N(0, 0.1^2); tid2eid rows of 2 distinct experts.
template <class T>
void init_random(Model<T>& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto& P = m.params();
  for (const auto& p : P.entries()) {
    T* v = P.arena_value(p);
    const bool is_norm = p.name.find("norm") != std::string::npos && p.shape.size() == 1;
    for (int64_t i = 0; i < p.numel; ++i) v[i] = T(is_norm ? 1.0 + 0.1 * nd(rng) : 0.3 * nd(rng));
  }
  for (auto& [name, b] : P.bias)
    for (auto& x : b) x = float(0.1 * nd(rng));
  std::uniform_int_distribution<int> ue(0, int(m.config().n_routed_experts) - 1);
  for (auto& [name, t] : P.tid2eid)
    for (size_t r = 0; r < t.size(); r += 2) {
      t[r] = ue(rng);
      do t[r + 1] = ue(rng);
      while (t[r + 1] == t[r]);
    }
}

// Copies every tensor and buffer the stage holds from the whole model, by name.
template <class T>
void copy_by_name(const Model<T>& full, Model<T>& stage) {
  auto& S = stage.params();
  const auto& F = full.params();
  for (const auto& p : S.entries()) {
    const ParamInfo& fp = F.info(p.name);
    ASSERT_EQ(fp.shape, p.shape) << p.name;
    std::memcpy(S.arena_value(p), F.arena_value(fp), size_t(p.numel) * sizeof(T));
  }
  for (auto& [name, b] : S.bias) b = F.bias.at(name);
  for (auto& [name, t] : S.tid2eid) t = F.tid2eid.at(name);
}

struct MicroBatch {
  std::vector<int32_t> ids, labels;
  SeqLayout layout;
};

std::vector<MicroBatch> make_batches(const ModelConfig& cfg, int64_t n, uint64_t seed) {
  const int64_t B = 2, S = 16;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> ut(0, int(cfg.vocab_size) - 1);
  std::vector<MicroBatch> out(static_cast<size_t>(n));
  for (int64_t m = 0; m < n; ++m) {
    MicroBatch& mb = out[size_t(m)];
    mb.ids.resize(size_t(B * S));
    mb.labels.resize(size_t(B * S));
    for (size_t i = 0; i < mb.ids.size(); ++i) mb.ids[i] = ut(rng), mb.labels[i] = mb.ids[i];
    for (int64_t s = 0; s < 3 + m; ++s) mb.labels[size_t(s)] = -100;  // unlabelled prompt spans of varying length
    // Packed documents of different lengths in every micro-batch (row 0 one document in micro-batch 0).
    const std::vector<std::vector<int64_t>> docs[3] = {{{16}, {9, 7}}, {{5, 11}, {16}}, {{3, 6, 7}, {10, 6}}};
    mb.layout = SeqLayout::packed(S, docs[m % 3]);
  }
  return out;
}

// What the whole model gives over a step: per micro-batch loss parts and expert loads, and the gradients
// accumulated over the micro-batches and scaled by 1/n as src/train/trainer.cpp does.
template <class T>
struct Reference {
  std::vector<LossParts> parts;
  std::vector<std::map<std::string, std::vector<int64_t>>> loads;  // per micro-batch, by block prefix
  std::map<std::string, std::vector<T>> grads;
  double mean_loss = 0;
};

template <class T>
Reference<T> run_whole(Model<T>& full, const std::vector<MicroBatch>& mbs) {
  Reference<T> r;
  full.params().zero_grads();
  for (const auto& mb : mbs) {
    r.mean_loss += full.forward(mb.ids.data(), mb.labels.data(), mb.layout) / double(mbs.size());
    r.parts.push_back(full.loss_parts());
    std::map<std::string, std::vector<int64_t>> l;
    for (int64_t b = 0; b < full.n_blocks(); ++b) l[full.block_prefix(b)] = full.expert_load(b);
    r.loads.push_back(l);
    full.backward();
  }
  const T scale = T(1.0 / double(mbs.size()));
  auto& P = full.params();
  for (const auto& p : P.entries()) {
    std::vector<T> g(P.arena_grad(p), P.arena_grad(p) + p.numel);
    for (auto& x : g) x *= scale;
    r.grads[p.name] = std::move(g);
  }
  return r;
}

// One op of a stage's 1F1B list: forward or backward of micro-batch m.
struct Op {
  bool fwd;
  int64_t m;
};

// 1F1B for stage i of P with M micro-batches: min(P-1-i, M) warm-up forwards, then one forward / one backward
// pairs, then the remaining backwards. Stage i has at most P-i micro-batches in flight.
std::vector<Op> one_f_one_b(int64_t i, int64_t P, int64_t M) {
  std::vector<Op> ops;
  const int64_t warm = std::min(P - 1 - i, M);
  int64_t f = 0, b = 0;
  for (; f < warm; ++f) ops.push_back({true, f});
  while (f < M) {
    ops.push_back({true, f++});
    ops.push_back({false, b++});
  }
  while (b < M) ops.push_back({false, b++});
  return ops;
}

struct PipelineResult {
  std::vector<double> stage_loss;                                    // sum of forward returns per stage
  std::vector<LossParts> parts;                                      // per micro-batch, summed over stages
  std::vector<std::map<std::string, std::vector<int64_t>>> loads;  // per micro-batch, by block prefix
  int64_t max_in_flight = 0;
};

// Runs the stages' 1F1B lists in dependency order (forward m on stage i after stage i-1's; backward m after stage
// i+1's), passing boundary streams and their gradients by hand. Slot of micro-batch m on stage i: m % (P - i).
template <class T>
PipelineResult run_pipeline(std::vector<std::unique_ptr<Model<T>>>& stages, const std::vector<MicroBatch>& mbs) {
  const int64_t P = int64_t(stages.size()), M = int64_t(mbs.size());
  const int64_t elems = stages[0]->stream_elems(mbs[0].layout.n_tokens());
  PipelineResult r;
  r.stage_loss.assign(size_t(P), 0.0);
  r.parts.assign(size_t(M), LossParts{});
  r.loads.assign(size_t(M), {});
  // x[i][m]: stream from stage i to i+1; dx[i][m]: its gradient.
  std::vector<std::vector<std::vector<T>>> x(static_cast<size_t>(P)), dx(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) {
    x[size_t(i)].assign(size_t(M), {});
    dx[size_t(i)].assign(size_t(M), {});
    stages[size_t(i)]->set_slots(P - i);
    stages[size_t(i)]->params().zero_grads();
  }
  std::vector<std::vector<Op>> ops(static_cast<size_t>(P));
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<std::vector<int64_t>> slot_owner(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) {
    ops[size_t(i)] = one_f_one_b(i, P, M);
    slot_owner[size_t(i)].assign(size_t(P - i), -1);
  }
  std::vector<std::vector<char>> fdone(size_t(P), std::vector<char>(size_t(M), 0)), bdone = fdone;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t i = 0; i < P; ++i) {
      auto& st = *stages[size_t(i)];
      if (next[size_t(i)] >= ops[size_t(i)].size()) continue;
      const Op op = ops[size_t(i)][next[size_t(i)]];
      const MicroBatch& mb = mbs[size_t(op.m)];
      const int64_t slot = op.m % (P - i);
      if (op.fwd) {
        if (i > 0 && !fdone[size_t(i - 1)][size_t(op.m)]) continue;
        EXPECT_EQ(slot_owner[size_t(i)][size_t(slot)], -1) << "stage " << i << " slot " << slot << " still busy";
        slot_owner[size_t(i)][size_t(slot)] = op.m;
        int64_t busy = 0;
        for (auto o : slot_owner[size_t(i)]) busy += o >= 0;
        r.max_in_flight = std::max(r.max_in_flight, busy);
        const T* xin = i > 0 ? x[size_t(i - 1)][size_t(op.m)].data() : nullptr;
        T* xout = nullptr;
        if (i + 1 < P) {
          x[size_t(i)][size_t(op.m)].assign(size_t(elems), T(0));
          xout = x[size_t(i)][size_t(op.m)].data();
        }
        r.stage_loss[size_t(i)] +=
            st.forward_stage(slot, mb.ids.data(), mb.labels.data(), mb.layout, xin, xout, 1.0 / double(M));
        const LossParts& lp = st.loss_parts(slot);
        LossParts& acc = r.parts[size_t(op.m)];
        acc.lm += lp.lm, acc.mtp += lp.mtp, acc.balance += lp.balance, acc.total += lp.total;
        acc.lm_targets += lp.lm_targets, acc.mtp_targets += lp.mtp_targets;
        for (int64_t b = 0; b < st.n_blocks(); ++b) r.loads[size_t(op.m)][st.block_prefix(b)] = st.expert_load(b);
        fdone[size_t(i)][size_t(op.m)] = 1;
      } else {
        if (i + 1 < P ? !bdone[size_t(i + 1)][size_t(op.m)] : !fdone[size_t(i)][size_t(op.m)]) continue;
        EXPECT_EQ(slot_owner[size_t(i)][size_t(slot)], op.m);
        const T* dxout = i + 1 < P ? dx[size_t(i)][size_t(op.m)].data() : nullptr;
        T* dxin = nullptr;
        if (i > 0) {
          dx[size_t(i - 1)][size_t(op.m)].assign(size_t(elems), T(0));
          dxin = dx[size_t(i - 1)][size_t(op.m)].data();
        }
        st.backward_stage(slot, dxout, dxin);
        slot_owner[size_t(i)][size_t(slot)] = -1;
        bdone[size_t(i)][size_t(op.m)] = 1;
      }
      ++next[size_t(i)];
      progress = true;
    }
  }
  for (int64_t i = 0; i < P; ++i) EXPECT_EQ(next[size_t(i)], ops[size_t(i)].size()) << "stage " << i << " stalled";
  return r;
}

// max |a - b| / max(max |b|, floor) over a tensor.
template <class T>
double rel_err(const std::vector<T>& a, const std::vector<T>& b, double floor) {
  double num = 0, den = floor;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den == 0 ? num : num / den;
}

// Builds the stages, copies weights, runs the pipeline and compares everything with the whole model.
template <class T>
void check_split(const std::vector<ModelPartition>& parts, int64_t n_micro, double tol) {
  const ModelConfig cfg = stage_config();
  const ModelOptions opts = stage_options();
  Model<T> full(cfg, opts);
  init_random(full, 17);
  const auto mbs = make_batches(cfg, n_micro, 23);
  const Reference<T> ref = run_whole(full, mbs);

  std::vector<std::unique_ptr<Model<T>>> stages;
  for (const auto& p : parts) {
    stages.push_back(std::make_unique<Model<T>>(cfg, opts, p));
    copy_by_name(full, *stages.back());
  }
  const int64_t P = int64_t(stages.size());
  const PipelineResult res = run_pipeline(stages, mbs);
  EXPECT_EQ(res.max_in_flight, std::min(P, n_micro)) << "1F1B should keep P micro-batches in flight on stage 0";

  // Losses: per micro-batch parts (balance summed over the stages' layers) and the step's mean.
  double total = 0;
  for (double l : res.stage_loss) total += l;
  EXPECT_NEAR(total, ref.mean_loss, tol * std::fabs(ref.mean_loss));
  for (int64_t m = 0; m < n_micro; ++m) {
    const LossParts& a = res.parts[size_t(m)];
    const LossParts& b = ref.parts[size_t(m)];
    EXPECT_NEAR(a.lm, b.lm, tol * b.lm) << "micro-batch " << m;
    EXPECT_NEAR(a.mtp, b.mtp, tol * b.mtp) << "micro-batch " << m;
    EXPECT_NEAR(a.balance, b.balance, tol * b.balance) << "micro-batch " << m;
    EXPECT_NEAR(a.total, b.total, tol * b.total) << "micro-batch " << m;
    EXPECT_EQ(a.lm_targets, b.lm_targets);
    EXPECT_EQ(a.mtp_targets, b.mtp_targets);
    EXPECT_GT(b.balance, 0.0);
    EXPECT_GT(b.mtp, 0.0);
    EXPECT_EQ(res.loads[size_t(m)], ref.loads[size_t(m)]) << "expert loads of micro-batch " << m;
  }

  // Every tensor on exactly one stage, except the shared ones, which every holder lists; their gradients summed.
  std::map<std::string, std::vector<T>> got;
  std::map<std::string, int> holders;
  std::set<std::string> shared;
  for (auto& st : stages) {
    for (const auto& n : st->stage_shared_params()) shared.insert(n);
    auto& Pt = st->params();
    for (const auto& p : Pt.entries()) {
      auto& g = got[p.name];
      if (g.empty()) g.assign(size_t(p.numel), T(0));
      for (int64_t i = 0; i < p.numel; ++i) g[size_t(i)] += Pt.arena_grad(p)[i];
      ++holders[p.name];
    }
  }
  if (P > 1) {
    EXPECT_EQ(shared, std::set<std::string>{"embed.weight"});
  }
  EXPECT_EQ(got.size(), ref.grads.size());
  // A tensor whose gradient is a sum of cancelling terms (mtp.0.hc_head_base: ~1e-5 of the largest gradient) keeps
  // few significant bits in fp32 whether the 1/n scale is applied per micro-batch or at the end, so errors are
  // relative to max(the tensor's largest gradient, 1e-3 x the model's largest gradient).
  double gmax = 0;
  for (const auto& [name, g] : ref.grads)
    for (T v : g) gmax = std::max(gmax, std::fabs(double(v)));
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : ref.grads) {
    ASSERT_TRUE(got.count(name)) << name << " is on no stage";
    EXPECT_EQ(holders[name], shared.count(name) ? 2 : 1) << name;
    const double e = rel_err(got[name], g, 1e-3 * gmax);
    if (e > worst) worst = e, worst_name = name;
    EXPECT_LT(e, tol) << name;
  }
  ::testing::Test::RecordProperty("worst_rel_err", std::to_string(worst) + " at " + worst_name);
  // The gradients are not trivially zero.
  double norm = 0;
  for (const auto& [name, g] : ref.grads)
    for (T v : g) norm += double(v) * v;
  EXPECT_GT(norm, 1e-6);
}

}  // namespace

// fp64 shows the split computes the same function (agreement to rounding); fp32 is what training runs.
TEST(ModelStages, TwoStagesOneFOneBMatchWholeModel) {
  check_split<double>(split_layers(stage_config(), 2), 3, 1e-12);
  check_split<float>(split_layers(stage_config(), 2), 3, 1e-5);
}

TEST(ModelStages, ThreeStagesOneFOneBMatchWholeModel) {
  check_split<double>(split_layers(stage_config(), 3), 3, 1e-12);
  check_split<float>(split_layers(stage_config(), 3), 3, 1e-5);
}

TEST(ModelStages, TwoMicroBatchesOnThreeStages) { check_split<float>(split_layers(stage_config(), 3), 2, 1e-5); }

// A stage of only padding (identity) layers between two real ones, and a head stage with no main layer: the chain
// still gives the whole model's result, and the identity stage passes stream and gradient through bit-exactly.
TEST(ModelStages, IdentityLayersChangeNothing) {
  const ModelConfig cfg = stage_config();
  std::vector<ModelPartition> parts(4);
  parts[0].layer_begin = 0, parts[0].layer_end = 2, parts[0].head = false;
  parts[1].layer_begin = 2, parts[1].layer_end = 2, parts[1].identity_layers = 1, parts[1].embed = false;
  parts[1].head = false;
  parts[2].layer_begin = 2, parts[2].layer_end = 4, parts[2].embed = false, parts[2].head = false;
  parts[3].layer_begin = 4, parts[3].layer_end = 4, parts[3].identity_layers = 2, parts[3].embed = false;
  check_split<double>(parts, 3, 1e-12);
  check_split<float>(parts, 3, 1e-5);

  const ModelOptions opts = stage_options();
  Model<float> id(cfg, opts, parts[1]);
  EXPECT_EQ(id.params().entries().size(), 0u);
  EXPECT_EQ(id.n_blocks(), 0);
  const auto mbs = make_batches(cfg, 1, 5);
  const int64_t n = id.stream_elems(mbs[0].layout.n_tokens());
  std::vector<float> xin(static_cast<size_t>(n)), xout(static_cast<size_t>(n)), dxin(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : xin) v = nd(rng);
  EXPECT_EQ(id.forward_stage(0, mbs[0].ids.data(), nullptr, mbs[0].layout, xin.data(), xout.data(), 0.5), 0.0);
  EXPECT_EQ(xout, xin);
  id.backward_stage(0, xin.data(), dxin.data());
  EXPECT_EQ(dxin, xin);
}

TEST(ModelStages, SplitLayersPadsTheLastChunks) {
  ModelConfig cfg = stage_config();
  cfg.n_layers = 43;  // V4-Flash: 43 layers, padded to 44 for PP=4 (11 slots per stage)
  auto p = split_layers(cfg, 4, 1);
  ASSERT_EQ(p.size(), 4u);
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(p[size_t(c)].layer_end - p[size_t(c)].layer_begin + p[size_t(c)].identity_layers, 11);
    EXPECT_EQ(p[size_t(c)].embed, c == 0);
    EXPECT_EQ(p[size_t(c)].head, c == 3);
  }
  EXPECT_EQ(p[3].layer_begin, 33);
  EXPECT_EQ(p[3].layer_end, 43);
  EXPECT_EQ(p[3].identity_layers, 1);
  // Uneven without padding: larger chunks first; interleaved chunks (P=2, v=2) cover the layers in order.
  cfg.n_layers = 10;
  p = split_layers(cfg, 4);
  const int64_t want[4][2] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(p[size_t(c)].layer_begin, want[c][0]);
    EXPECT_EQ(p[size_t(c)].layer_end, want[c][1]);
    EXPECT_EQ(p[size_t(c)].identity_layers, 0);
  }
}

TEST(ModelStages, DeclaresOnlyItsTensorsAndChecksUse) {
  const ModelConfig cfg = stage_config();
  const ModelOptions opts = stage_options();
  auto parts = split_layers(cfg, 2);
  Model<float> first(cfg, opts, parts[0]), last(cfg, opts, parts[1]);
  EXPECT_TRUE(first.params().has("embed.weight"));
  EXPECT_TRUE(first.params().has("layers.1.attn.wkv.weight"));
  EXPECT_FALSE(first.params().has("layers.2.attn.wkv.weight"));
  EXPECT_FALSE(first.params().has("head.weight"));
  EXPECT_FALSE(first.has_mtp());
  EXPECT_TRUE(first.params().tid2eid.count("layers.0.ffn.gate.tid2eid"));
  EXPECT_TRUE(last.params().has("embed.weight"));  // the MTP's copy
  EXPECT_TRUE(last.params().has("mtp.0.e_proj.weight"));
  EXPECT_TRUE(last.has_mtp());
  EXPECT_EQ(last.n_blocks(), 3);  // layers 2, 3 and the MTP block
  EXPECT_EQ(last.block_prefix(2), "mtp.0.");
  // Without MTP the head stage needs no embedding, and nothing is shared.
  ModelOptions no_mtp = opts;
  no_mtp.use_mtp = false;
  Model<float> last_plain(cfg, no_mtp, parts[1]);
  EXPECT_FALSE(last_plain.params().has("embed.weight"));
  EXPECT_TRUE(last_plain.stage_shared_params().empty());
  // declared_params lists the same tensors without allocating.
  const ParamTable<float> decl = Model<float>::declared_params(cfg, opts, parts[1]);
  ASSERT_EQ(decl.entries().size(), last.params().entries().size());
  EXPECT_FALSE(decl.allocated());
  // Misuse: whole-model forward on a stage, missing boundary tensors, bad partitions.
  const auto mbs = make_batches(cfg, 1, 3);
  EXPECT_THROW(first.forward(mbs[0].ids.data(), mbs[0].labels.data(), mbs[0].layout), trex::Error);
  EXPECT_THROW(last.forward_stage(0, mbs[0].ids.data(), mbs[0].labels.data(), mbs[0].layout, nullptr, nullptr),
               trex::Error);
  EXPECT_THROW(last.backward_stage(0, nullptr, nullptr), trex::Error);  // no forward on the slot
  ModelPartition bad;
  bad.layer_begin = 1;  // the embed stage must start at layer 0
  auto build = [&](const ModelPartition& p) { Model<float> x(cfg, opts, p); };
  EXPECT_THROW(build(bad), trex::Error);
  bad = ModelPartition{};
  bad.layer_end = 9;
  EXPECT_THROW(build(bad), trex::Error);
}

// The gradient-ready hook: each block's group arrives once per backward, last block first, the rest at the end,
// every tensor exactly once, and a block's gradients do not change after its hook fired.
TEST(ModelStages, GradReadyHookFiresWhenBlockGradientsAreFinal) {
  const ModelConfig cfg = stage_config();
  const ModelOptions opts = stage_options();
  Model<float> m(cfg, opts);
  init_random(m, 4);
  const auto mbs = make_batches(cfg, 1, 8);
  std::vector<int64_t> order;
  std::map<std::string, int> seen;
  std::map<std::string, std::vector<float>> at_hook;
  auto& P = m.params();
  m.set_grad_ready_hook([&](int64_t block, const std::vector<const ParamInfo*>& ps) {
    order.push_back(block);
    // A block's tensors are one contiguous slice of the gradient arena (a reducer can reduce it as one bucket).
    if (block >= 0) {
      for (size_t i = 1; i < ps.size(); ++i)
        EXPECT_EQ(ps[i]->offset, ps[i - 1]->offset + (ps[i - 1]->numel + 15) / 16 * 16) << ps[i]->name;
    }
    for (const ParamInfo* p : ps) {
      ++seen[p->name];
      at_hook[p->name].assign(P.arena_grad(*p), P.arena_grad(*p) + p->numel);
    }
  });
  P.zero_grads();
  m.forward(mbs[0].ids.data(), mbs[0].labels.data(), mbs[0].layout);
  m.backward();
  const std::vector<int64_t> want = {4, 3, 2, 1, 0, -1};  // MTP block, layers 3..0, then the rest
  EXPECT_EQ(order, want);
  EXPECT_EQ(seen.size(), P.entries().size());
  for (const auto& p : P.entries()) {
    EXPECT_EQ(seen[p.name], 1) << p.name;
    const std::vector<float> now(P.arena_grad(p), P.arena_grad(p) + p.numel);
    EXPECT_EQ(at_hook[p.name], now) << p.name << " changed after its gradient-ready hook";
  }
  int64_t nonzero = 0;
  for (const auto& [name, g] : at_hook)
    for (float v : g) nonzero += v != 0.f;
  EXPECT_GT(nonzero, 0);
}
