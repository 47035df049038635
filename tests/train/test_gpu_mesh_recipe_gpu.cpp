// The V4 recipe in every GPU layout (issue 17 item 4): the MTP module (its experts placed over ep, on the last
// pipeline stage with a tied copy of embed.weight summed over the {first, last} stage group), the router frozen
// and the sequence-wise balance loss (each stage its own layers' terms), under the Trainer, every rank a thread of
// this process on one GPU over the thread-group communicator:
//  - ep = 2 (parallel {dp: 2, ep: 2}), dp = 2 x ep = 2 ({dp: 4, ep: 2}), pp = 2, pp = 2 x dp = 2 and pp = 2 x dp = 2
//    x ep = 2 ({pp: 2, dp: 4, ep: 2}: 8 ranks) give the one-rank run of the same global batch (8 micro-batches a
//    step): every step's loss (rel 5e-3: CE + MTP + every stage's balance terms), gradient norm (rel 5e-2: the
//    tied embedding counted once) and target count; the final checkpoints hold the same tensor and optimiser
//    state names (embed.weight written once: the manifest refuses a name written twice), every tensor within
//    bf16 noise of the one-rank run's, and the frozen router weights bit-equal to the one-rank run's (their
//    initial values);
//  - a pp = 2 run's step-3 checkpoint (MTP tensors on the last stage, embed.weight from the first) resumes on one
//    rank and continues the one-rank run's losses.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "comm/two_rank_threads.h"
#include "kernels/gpu_test_util.h"
#include "train/config.h"
#include "train/cuda/gpu_mesh_engine.h"
#include "train/dsv4_trainable.h"
#include "train/metrics.h"
#include "train/sharded_checkpoint.h"
#include "train/tiny_gpu_config.h"
#include "train/trainer.h"
#include "train/yaml.h"
#include "tiny_corpus.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;

namespace {

using Data = trex::testing::TinyCorpus;
Data& dat() {
  static Data d = [] {
    std::vector<std::string> t;
    for (int i = 0; i < 60; ++i)
      t.push_back("predict " + std::to_string(i % 5) + " tokens ahead with expert " + std::to_string(i % 7) +
                  " on stage " + std::to_string(i % 2) + ". ");
    return Data("trex_gpu_mesh_recipe", t, 300, 64);
  }();
  return d;
}

dsv4::ModelConfig model_config() {
  // 3 layers (stages [0, 2), [2, 3)) and the MTP module (a sliding, score-routed block with 8 routed experts).
  dsv4::ModelConfig c = trex::testing::tiny_gpu_config("tiny GPU recipe config", 1);
  c.vocab_size = std::max<int64_t>(c.vocab_size, (dat().tok.vocab_size() + 63) / 64 * 64);
  return c;
}

Dsv4TrainOptions train_options() {
  Dsv4TrainOptions o;
  o.model.use_mtp = true;
  // Large: a stage's balance terms left out of the loss, or a micro-batch's share counted twice, moves the loss
  // by about 1% (the loss bound is 0.5%).
  o.model.balance_alpha = 0.05;
  o.bias_update_speed = 1e-3;
  // The fixed-order attention backward: the layouts differ only by summation order across ranks.
  o.deterministic = true;
  return o;
}

constexpr const char* kRouter = "*.ffn.gate.weight";  // the SFT recipe's frozen router (the MTP block's too)

// 8 micro-batches of 2 sequences a step: one rank accumulates 8; dp = 2 / 4 split them; pp = 2 runs them through
// each DP index's pipeline.
TrainConfig run_config(const std::string& parallel) {
  return parse_train_config(parse_yaml(R"(
seed: 5
model: {type: dsv4, balance_alpha: 0.05}
data: {shards: x, tokenizer: y, seq_len: 64, batch_size: 2, grad_accum: 8}
optimizer: {kind: adamw, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: false}}
schedule: {lr: 0.003, min_lr: 0.0003, warmup_steps: 2}
train: {max_steps: 6}
checkpoint: {every: 3, keep_last: 2}
logging: {plot: false}
freeze: [")" + std::string(kRouter) + R"("]
parallel: )" + parallel + "\n",
                                       "recipe.yaml"),
                            "recipe.yaml");
}

void train_ranks(const TrainConfig& cfg, int ranks, const fs::path& out, int64_t stop = -1) {
  auto group = comm::make_thread_group(ranks, 300.0);
  trex::testing::run_ranks(group, [&](int r) {  // a rank that throws aborts the group: the others stop too
    GpuMeshEngine engine(cfg, model_config(), train_options(), *group[size_t(r)]);
    TrainerOptions q;
    q.show_progress = false;
    q.stop_at = stop;
    Trainer(cfg, out, engine, *dat().ds, 1, q).run();
  });
}

const fs::path& one_rank_run() {  // the reference: one rank, 6 steps (checkpoints at 3 and 6)
  static const fs::path out = [] {
    const fs::path o = dat().dir / "one";
    fs::remove_all(o);
    train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 1, o);
    return o;
  }();
  return out;
}

// Every step of `dir` against the one-rank run: loss rel 5e-3, grad norm rel 5e-2, targets.
void expect_steps_match(const fs::path& dir, const std::string& what) {
  const auto m1 = read_jsonl(one_rank_run() / "metrics.jsonl"), m2 = read_jsonl(dir / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(m2.size(), 6u) << what;
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(m2[i]["step"], m1[i]["step"]) << what;
    const double a = m1[i]["loss"].get<double>(), b = m2[i]["loss"].get<double>();
    const double ga = m1[i]["grad_norm"].get<double>(), gb = m2[i]["grad_norm"].get<double>();
    std::printf("  %s step %zu: loss one rank %.6f, %.6f; grad norm %.5f / %.5f\n", what.c_str(), i + 1, a, b, ga,
                gb);
    EXPECT_LT(std::abs(a - b) / a, 5e-3) << what << " step " << i + 1;
    EXPECT_LT(std::abs(ga - gb) / ga, 5e-2) << what << " step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], m2[i]["targets"]) << what << " step " << i + 1 << ": the global batch differs";
  }
  EXPECT_LT(m2.back()["loss"].get<double>(), m2.front()["loss"].get<double>()) << what << ": the loss does not fall";
}

using trex::gpu_test::rel_l2;

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return std::isfinite(m) ? m : INFINITY;
}

bool frozen_router(const std::string& n) { return n.ends_with(".ffn.gate.weight"); }

// The layout's step-6 checkpoint against the one-rank run's: the same names (each written once), every tensor
// within bf16 noise, the frozen router weights bit-equal.
void expect_checkpoint_matches(const fs::path& dir, int ranks, const std::string& what) {
  const fs::path ck = dir / "checkpoints" / "step_00000006";
  ASSERT_TRUE(fs::exists(ck / "manifest.json")) << ck;
  for (int r = 0; r < ranks; ++r) EXPECT_TRUE(fs::exists(ck / ("rank-" + std::to_string(r) + ".safetensors"))) << r;
  const CheckpointReader mine(ck), ref(one_rank_run() / "checkpoints" / "step_00000006");
  ASSERT_EQ(mine.param_names(), ref.param_names()) << what;
  EXPECT_EQ(mine.optim_names(), ref.optim_names()) << what;
  EXPECT_EQ(mine.optimizer_steps(), 6);
  double worst = 0;
  std::string worst_name;
  int mtp_tensors = 0, mtp_experts = 0, frozen = 0;
  for (const std::string& name : ref.param_names()) {
    if (name.ends_with("ffn.gate.bias") || name.ends_with("ffn.gate.tid2eid")) continue;  // buffers
    const Shape shape = ref.param_shape(name);
    ASSERT_EQ(mine.param_shape(name), shape) << name;
    std::vector<float> a(size_t(numel(shape))), b(a.size());
    ref.read_param(name, shape, a.data());
    mine.read_param(name, shape, b.data());
    mtp_tensors += name.starts_with("mtp.0.");
    mtp_experts += name.starts_with("mtp.0.ffn.experts.");
    if (frozen_router(name)) {
      ++frozen;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << what << ": frozen " << name << " differs";
      continue;
    }
    if (a.size() >= 64) {
      const double e = rel_l2(b, a);
      EXPECT_LT(e, 2e-2) << what << ": " << name;
      if (e > worst) worst = e, worst_name = name;
    } else {
      EXPECT_LT(max_abs(b, a), 2e-2) << what << ": " << name;
    }
  }
  EXPECT_GT(mtp_tensors, 0) << "no MTP tensor in the checkpoint";
  EXPECT_EQ(mtp_experts, 3 * 8) << "w1, w2, w3 of the MTP block's 8 experts";
  EXPECT_EQ(frozen, 4) << "the router weights of the 3 layers and the MTP block";
  std::printf("%s: final weights vs one rank, worst rel L2 %.2e (%s)\n", what.c_str(), worst, worst_name.c_str());
}

struct Layout {
  const char* name;
  const char* parallel;
  int ranks;
};

class GpuMeshRecipe : public ::testing::TestWithParam<Layout> {};

}  // namespace

TEST_P(GpuMeshRecipe, MatchesOneRankOnTheGlobalBatch) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const Layout l = GetParam();
  one_rank_run();
  if (HasFatalFailure()) return;
  const fs::path dir = dat().dir / l.name;
  fs::remove_all(dir);
  train_ranks(run_config(l.parallel), l.ranks, dir);
  if (HasFatalFailure()) return;
  expect_steps_match(dir, l.name);
  expect_checkpoint_matches(dir, l.ranks, l.name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuMeshRecipe,
                         ::testing::Values(Layout{"ep2", "{pp: 1, dp: 2, ep: 2}", 2},
                                           Layout{"dp2_ep2", "{pp: 1, dp: 4, ep: 2}", 4},
                                           Layout{"pp2", "{pp: 2, dp: 1, ep: 1}", 2},
                                           Layout{"pp2_dp2", "{pp: 2, dp: 2, ep: 1}", 4},
                                           Layout{"pp2_dp2_ep2", "{pp: 2, dp: 4, ep: 2}", 8}),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

// pp = 2 stops at step 3 (its checkpoint: embed.weight from the first stage, the MTP module's tensors and moments
// from the last); one rank resumes it and steps 4..6 continue the uninterrupted one-rank run.
TEST(GpuMeshRecipeResume, OneRankContinuesATwoStageMtpCheckpoint) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  one_rank_run();
  if (HasFatalFailure()) return;
  const fs::path out = dat().dir / "pp2_then_one";
  fs::remove_all(out);
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1}"), 2, out, 3);
  if (HasFatalFailure()) return;
  const fs::path ck = out / "checkpoints" / "step_00000003";
  ASSERT_TRUE(fs::exists(ck / "manifest.json")) << ck;
  {
    const CheckpointReader r(ck);
    EXPECT_TRUE(r.has_param("embed.weight"));
    EXPECT_TRUE(r.has_param("mtp.0.e_proj.weight"));
    EXPECT_TRUE(r.has_optim("mtp.0.e_proj.weight.exp_avg"));
  }
  train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 1, out);
  if (HasFatalFailure()) return;
  expect_steps_match(out, "pp=2 -> one rank");
}
