// The whole CPU DeepSeek-V4 model with expert parallelism (issue 10 part 3) against a single-process run.
//
// Under mpirun (ep_test_util.h), every rank builds the same random micro model (hash and score MoE layers, a shared
// expert, 8 routed experts, top-2, the MTP block, the balance loss) as a reference holding everything, and a model
// holding only its mesh's expert shard, whose MoE layers exchange over the EP group. Each rank runs its own rows
// of the global batch; after the data-parallel mean of the dense gradients (over DP) and of the expert gradients
// (over the expert-data-parallel group), the loss and every gradient, by official name, equal the reference's run
// of the whole batch (fp32, 1e-5 relative). Also with routing skewed so that every token goes to experts 0 and 1.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "model/dsv4/model.h"
#include "parallel/ep_exchange.h"
#include "parallel/ep_test_util.h"
#include "parallel/mesh.h"

using namespace trex;
using namespace trex::dsv4;
using namespace trex::ep_test;

namespace {

ModelConfig ep_config() {
  ModelConfig c;
  c.vocab_size = 16, c.hidden = 8, c.n_layers = 3, c.n_heads = 2, c.head_dim = 8, c.rope_dim = 4;
  c.q_lora_rank = 8, c.o_groups = 2, c.o_lora_rank = 4, c.window = 4;
  c.index_n_heads = 2, c.index_head_dim = 4, c.index_topk = 2;
  c.n_routed_experts = 8, c.n_shared_experts = 1, c.topk = 2, c.moe_inter = 4;
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

// Norm weights near 1, everything else N(0, 0.4^2); router biases N(0, 0.1^2); tid2eid rows two distinct experts.
// skew: biases +100 on experts 0 and 1 and every tid2eid row (0, 1), so every token goes to them.
void init_model(Model<float>& m, uint64_t seed, bool skew) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto& P = m.params();
  for (const auto& p : P.entries()) {
    float* v = P.arena_value(p);
    const bool is_norm = p.name.find("norm") != std::string::npos && p.shape.size() == 1;
    for (int64_t i = 0; i < p.numel; ++i) v[i] = float(is_norm ? 1.0 + 0.1 * nd(rng) : 0.4 * nd(rng));
  }
  for (auto& [name, b] : P.bias) {
    for (auto& x : b) x = float(0.1 * nd(rng));
    if (skew) b[0] = b[1] = 100.f;
  }
  std::uniform_int_distribution<int> ue(0, int(m.config().n_routed_experts) - 1);
  for (auto& [name, t] : P.tid2eid)
    for (size_t r = 0; r < t.size(); r += 2) {
      t[r] = skew ? 0 : ue(rng);
      t[r + 1] = skew ? 1 : ue(rng);
      while (t[r + 1] == t[r]) t[r + 1] = ue(rng);
    }
}

// Copies every tensor and buffer `dst` declares from `src` by name.
void copy_params(const Model<float>& src, Model<float>& dst) {
  for (const auto& p : dst.params().entries()) {
    const float* s = src.params().arena_value(src.params().info(p.name));
    std::copy_n(s, p.numel, dst.params().arena_value(p));
  }
  // In place: the model's MoE layers hold pointers into these buffers.
  for (auto& [name, b] : dst.params().bias) b = src.params().bias.at(name);
  for (auto& [name, t] : dst.params().tid2eid) t = src.params().tid2eid.at(name);
}

bool is_routed_expert(const std::string& name) { return name.find(".ffn.experts.") != std::string::npos; }

void check_model_ep(bool skew) {
  const ModelConfig cfg = ep_config();
  const int64_t E = cfg.n_routed_experts;
  const parallel::MeshSpec spec = parallel::parse_mesh_spec(worker_layout());
  parallel::Mesh mesh = parallel::build_mesh(world(), spec, {int(cfg.n_layers), int(E)});
  ModelOptions opts;
  opts.balance_alpha = 0.01;
  opts.mtp_weight = 0.3;

  Model<float> ref(cfg, opts);
  init_model(ref, skew ? 17 : 7, skew);
  ModelPartition part;
  part.expert_begin = mesh.first_local_expert(int(E));
  part.expert_end = part.expert_begin + mesh.n_local_experts(int(E));
  Model<float> m(cfg, opts, part);
  copy_params(ref, m);
  parallel::EpExchange ex(*mesh.ep_group, E, cfg.hidden);
  m.set_expert_exchange(&ex);
  const std::string at = " (rank " + std::to_string(mesh.world_rank) + ", " + worker_layout() +
                         (skew ? ", skewed)" : ")");

  // The shard's tensors: every dense one, and the routed experts [e0, e1) of each of the 4 MoE blocks.
  size_t n_ref_experts = 0, n_experts = 0;
  for (const auto& p : ref.params().entries()) n_ref_experts += is_routed_expert(p.name);
  for (const auto& p : m.params().entries()) n_experts += is_routed_expert(p.name);
  EXPECT_EQ(n_ref_experts, size_t(4 * 3 * E));
  EXPECT_EQ(n_experts, size_t(4 * 3 * (part.expert_end - part.expert_begin))) << at;
  EXPECT_EQ(m.params().entries().size() - n_experts, ref.params().entries().size() - n_ref_experts) << at;

  // The global batch: dp ranks x 2 rows of 12 tokens, every label used (so every rank has as many targets and the
  // mean over the batch is the mean over the ranks' means).
  const int dp = spec.dp;
  const int64_t Bl = 2, S = 12, B = dp * Bl;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int> ut(0, int(cfg.vocab_size) - 1);
  std::vector<int32_t> ids(size_t(B * S));
  for (auto& x : ids) x = ut(rng);
  const double ref_loss = ref.forward(ids.data(), ids.data(), SeqLayout::unpacked(B, S));
  ref.params().zero_grads();
  ref.backward();

  const int32_t* my = ids.data() + mesh.dp_rank * Bl * S;
  double loss = m.forward(my, my, SeqLayout::unpacked(Bl, S));
  m.params().zero_grads();
  m.backward();
  EXPECT_EQ(ex.handles(), 0u) << "the backward releases every (layer, micro-batch) handle" << at;
  mesh.dp_group->all_reduce_sum(&loss, 1);
  loss /= dp;
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss)) << at;

  // Data-parallel mean: dense tensors over DP, routed experts over their EDP group (their holder already has the
  // contributions of the whole EP group's tokens).
  int checked = 0;
  for (const auto& p : m.params().entries()) {
    std::vector<float> g(m.params().arena_grad(p), m.params().arena_grad(p) + p.numel);
    (is_routed_expert(p.name) ? *mesh.edp_group : *mesh.dp_group).all_reduce_sum(g.data(), g.size());
    for (auto& x : g) x /= float(dp);
    expect_close(p.name + at, g.data(), ref.params().grad(p.name), p.numel);
    ++checked;
  }
  EXPECT_EQ(checked, int(m.params().entries().size()));
  // Skewed: experts 0 and 1 took every slot of every layer.
  if (skew)
    for (int64_t l = 0; l < m.n_blocks(); ++l) {
      const auto& load = m.expert_load(l);
      EXPECT_EQ(load[0], Bl * S) << at;
      EXPECT_EQ(load[1], Bl * S) << at;
    }
}

}  // namespace

TEST(EpMpi, ModelTwoRanks) { run_workers(2, "dp=2,ep=2", "EpWorker.Model*"); }
TEST(EpMpi, ModelFourRanks) {
  run_workers(4, "dp=4,ep=4", "EpWorker.Model*");
  run_workers(4, "dp=4,ep=2", "EpWorker.Model*");  // EP=2 x 2 expert-data-parallel replicas
}

TEST(EpWorker, Model) {
  if (!worker_mode()) GTEST_SKIP() << "runs under mpirun (EpMpi.*)";
  check_model_ep(false);
  check_model_ep(true);
  std::printf("ep-worker ran Model on rank %d of %d\n", world().rank(), world().size());
}
