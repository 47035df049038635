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
#include "train/gpu_mesh_test_support.h"
#include "tiny_corpus.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;

namespace {

using Data = trex::testing::TinyCorpus;
Data& dat() {
  static Data d("trex_gpu_mesh_recipe", trex::testing::corpus_lines([](int i) {
                  return "predict " + std::to_string(i % 5) + " tokens ahead with expert " + std::to_string(i % 7) +
                         " on stage " + std::to_string(i % 2) + ". ";
                }),
                300, 64);
  return d;
}

dsv4::ModelConfig model_config() {
  // 3 layers (stages [0, 2), [2, 3)) and the MTP module (a sliding, score-routed block with 8 routed experts).
  return trex::testing::with_corpus_vocab(trex::testing::tiny_gpu_config("tiny GPU recipe config", 1), dat().tok);
}

Dsv4TrainOptions train_options() {
  // The fixed-order attention backward: the layouts differ only by summation order across ranks.
  Dsv4TrainOptions o = trex::testing::layout_train_options(true);
  o.model.use_mtp = true;
  // Large: a stage's balance terms left out of the loss, or a micro-batch's share counted twice, moves the loss
  // by about 1% (the loss bound is 0.5%).
  o.model.balance_alpha = 0.05;
  return o;
}

constexpr const char* kRouter = "*.ffn.gate.weight";  // the SFT recipe's frozen router (the MTP block's too)

// 8 micro-batches of 2 sequences a step: one rank accumulates 8; dp = 2 / 4 split them; pp = 2 runs them through
// each DP index's pipeline.
TrainConfig run_config(const std::string& parallel) {
  trex::testing::LayoutRunYaml y;
  y.seed = 5;
  y.model = "{type: dsv4, balance_alpha: 0.05}";
  y.optimizer = "{kind: adamw, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: false}}";
  y.extra = "freeze: [\"" + std::string(kRouter) + "\"]\n";
  return trex::testing::layout_run_config(y, "parallel: " + parallel + "\n", "recipe.yaml");
}

void train_ranks(const TrainConfig& cfg, int ranks, const fs::path& out, int64_t stop = -1) {
  trex::testing::train_on_thread_ranks(cfg, model_config(), train_options(), *dat().ds, ranks, out, stop, 300.0);
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
  trex::testing::expect_steps_match(one_rank_run(), dir, what, 0, 6, trex::testing::kLayoutStepBounds,
                                    [&](size_t, const nlohmann::json& ref, const nlohmann::json& got) {
                                      ASSERT_EQ(got["step"], ref["step"]) << what;
                                    });
  if (::testing::Test::HasFatalFailure()) return;
  trex::testing::expect_loss_falls(dir, what);
}

using trex::gpu_test::rel_l2;
using trex::testing::max_abs;

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
