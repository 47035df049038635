// Pipeline stages under the Trainer (train/cuda/gpu_mesh_pipeline.h: the GPU mesh engine with pp > 1), every rank
// a thread of this process on one GPU over the thread-group communicator (world rank = stage * dp + dp rank):
//  - pp = 2 (2 ranks), pp = 2 x dp = 2 (4 ranks), and with ep = 2 folded into dp = 2 (4 ranks) or dp = 4 (8
//    ranks) give the one-rank run of the same global batch (4 micro-batches
//    a step): every step's loss (the last stage's, summed over DP), gradient norm (the stages' squares summed)
//    and target count, with AdamW (decay on vectors too: every tensor's update depends on its own stage's
//    gradient only) and the router-bias update (each stage's loads); their checkpoints hold every tensor and
//    optimiser state of the one-rank run's exactly once (each stage writes its own);
//  - resume across layouts: a run stopped at step 3 is continued in another layout from its sharded checkpoint
//    and steps 4..6 give the uninterrupted one-rank run's losses: pp = 2 -> one rank, pp = 2 x dp = 2 -> dp = 2 x
//    ep = 2 (no stages, experts split), one rank -> pp = 2, and pp = 2 -> the CPU trainer (to the CPU / GPU
//    tolerance of test_gpu_trainer_gpu.cpp);
//  - a rank that fails (rank 3 of pp = 2 x dp = 2 throws in step 2) stops the other three with an error naming it
//    (the thread group's abort) long before the communicator's timeout, instead of leaving them in a collective.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "train/config.h"
#include "train/cuda/gpu_mesh_engine.h"
#include "train/dsv4_trainable.h"
#include "train/local_engine.h"
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
  static Data d("trex_gpu_mesh_pp", trex::testing::corpus_lines([](int i) {
                  return "stage " + std::to_string(i % 4) + " passes tokens to stage " + std::to_string(i % 3) + ". ";
                }),
                300, 64);
  return d;
}

dsv4::ModelConfig model_config() {  // 3 layers: stages [0,2), [2,3)
  return trex::testing::with_corpus_vocab(trex::testing::tiny_gpu_config("tiny GPU pipeline config"), dat().tok);
}

// The V4 recipe on stages: test_gpu_mesh_recipe_gpu.cpp.
Dsv4TrainOptions train_options() { return trex::testing::layout_train_options(false); }

// 4 micro-batches of 2 sequences a step: one rank accumulates 4, pp = 2 runs 4 through its pipeline, pp = 2 x dp
// = 2 runs 2 through each DP index's pipeline.
TrainConfig run_config(const std::string& parallel) {
  trex::testing::LayoutRunYaml y;
  y.model = "{type: dsv4, balance_alpha: 0, use_mtp: false}";
  y.grad_accum = 4;
  return trex::testing::layout_run_config(y, "parallel: " + parallel + "\n", "pp.yaml");
}

// `ranks` ranks of the config's layout as threads, under the Trainer (stop: TrainerOptions::stop_at).
void train_ranks(const TrainConfig& cfg, int ranks, const fs::path& out, int64_t stop = -1) {
  trex::testing::train_on_thread_ranks(cfg, model_config(), train_options(), *dat().ds, ranks, out, stop);
}

const fs::path& one_rank_run() {  // the reference: one rank, 6 steps (shared by the tests)
  static const fs::path out = [] {
    const fs::path o = dat().dir / "one";
    train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 1, o);
    return o;
  }();
  return out;
}

// stages x DP ranks = ranks; 4 micro-batches a step, 4 / dp through each pipeline.
void expect_matches_one_rank(const std::string& name, const std::string& parallel, int ranks, int stages) {
  const fs::path& one = one_rank_run();
  const fs::path out = dat().dir / name;
  train_ranks(run_config(parallel), ranks, out);
  if (::testing::Test::HasFatalFailure()) return;
  // Every step within the layout bounds; the pipeline's per-step timings, and 1F1B's ideal bubble of P stages over
  // M micro-batches.
  const double M = 4.0 / double(ranks / stages);
  trex::testing::expect_steps_match(one, out, name, 0, 6, trex::testing::kLayoutStepBounds,
                                    [&](size_t, const nlohmann::json&, const nlohmann::json& got) {
                                      EXPECT_TRUE(got.contains("pipeline_wait_s") &&
                                                  got["stage_forward_s"].get<double>() > 0)
                                          << got.dump();
                                      EXPECT_NEAR(got.value("bubble_fraction", -1.0),
                                                  (stages - 1) / (M + stages - 1), 1e-12)
                                          << got.dump();
                                    });
  if (::testing::Test::HasFatalFailure()) return;
  trex::testing::expect_loss_falls(out, name);
  // Each stage wrote its own tensors: together every parameter and optimiser state once (the manifest refuses
  // a name written twice), the one-rank checkpoint's names.
  const fs::path ck = out / "checkpoints" / "step_00000006";
  ASSERT_TRUE(fs::exists(ck / "manifest.json")) << ck;
  for (int r = 0; r < ranks; ++r) EXPECT_TRUE(fs::exists(ck / ("rank-" + std::to_string(r) + ".safetensors"))) << r;
  const CheckpointReader mine(ck), ref(one / "checkpoints" / "step_00000006");
  EXPECT_EQ(mine.param_names(), ref.param_names()) << name;
  EXPECT_EQ(mine.optim_names(), ref.optim_names()) << name;
  EXPECT_EQ(mine.optimizer_steps(), 6);
}

}  // namespace

TEST(GpuMeshPipeline, TwoStagesMatchOneRank) { expect_matches_one_rank("pp2", "{pp: 2, dp: 1, ep: 1}", 2, 2); }

TEST(GpuMeshPipeline, TwoStagesTimesTwoDataParallelRanksMatchOneRank) {
  expect_matches_one_rank("pp2_dp2", "{pp: 2, dp: 2, ep: 1}", 4, 2);
}

// Expert parallelism folded into each stage's DP ranks (each rank holds its stage's layers and half of their
// experts; an expert written by its owner).
TEST(GpuMeshPipeline, TwoStagesTimesTwoDataParallelWithTwoExpertParallelMatchOneRank) {
  expect_matches_one_rank("pp2_dp2_ep2", "{pp: 2, dp: 2, ep: 2}", 4, 2);
}

TEST(GpuMeshPipeline, TwoStagesTimesFourDataParallelWithTwoExpertParallelMatchOneRank) {
  expect_matches_one_rank("pp2_dp4_ep2", "{pp: 2, dp: 4, ep: 2}", 8, 2);
}

namespace {

// Steps 1..3 of `out` from the first layout, 4..6 from the layout that resumed its step-3 checkpoint, against the
// uninterrupted one-rank run.
void expect_continues_one_rank(const fs::path& out, const std::string& what, double tol) {
  trex::testing::expect_resumed_run_matches(one_rank_run(), out, what, tol);
}

}  // namespace

TEST(GpuMeshPipeline, OneRankContinuesATwoStageCheckpoint) {
  const fs::path out = dat().dir / "pp2_then_one";
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1}"), 2, out, 3);  // saved at step 3 (checkpoint every 3)
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fs::exists(out / "checkpoints" / "step_00000003" / "manifest.json"));
  train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 1, out);
  if (HasFatalFailure()) return;
  expect_continues_one_rank(out, "pp=2 -> one rank", 5e-3);
}

// pp = 2 x dp = 2 (each stage's dense optimiser state sharded over its 2 DP ranks, every expert on every rank of
// its stage) -> dp = 2 x ep = 2 (one stage, each rank half of every layer's experts).
TEST(GpuMeshPipeline, ExpertParallelRanksContinueAPipelineTimesDataParallelCheckpoint) {
  const fs::path out = dat().dir / "pp2_dp2_then_dp2_ep2";
  fs::remove_all(out);
  train_ranks(run_config("{pp: 2, dp: 2, ep: 1}"), 4, out, 3);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fs::exists(out / "checkpoints" / "step_00000003" / "manifest.json"));
  train_ranks(run_config("{pp: 1, dp: 2, ep: 2}"), 2, out);
  if (HasFatalFailure()) return;
  expect_continues_one_rank(out, "pp=2 x dp=2 -> dp=2 x ep=2", 5e-3);
}

TEST(GpuMeshPipeline, TwoStagesContinueAOneRankCheckpoint) {
  const fs::path out = dat().dir / "one_then_pp2";
  fs::remove_all(out);
  train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 1, out, 3);
  if (HasFatalFailure()) return;
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1}"), 2, out);
  if (HasFatalFailure()) return;
  expect_continues_one_rank(out, "one rank -> pp=2", 5e-3);
}

// The CPU trainer (fp32, LocalEngine over Dsv4Trainable) reads the stages' manifest: its steps 4..6 follow the GPU
// run to the CPU / GPU tolerance (2e-2, as the CPU resuming a one-GPU checkpoint in test_gpu_trainer_gpu.cpp).
TEST(GpuMeshPipeline, TheCpuTrainerContinuesATwoStageCheckpoint) {
  const fs::path out = dat().dir / "pp2_then_cpu";
  fs::remove_all(out);
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1}"), 2, out, 3);
  if (HasFatalFailure()) return;
  const TrainConfig cfg = run_config("{pp: 1, dp: 1, ep: 1}");
  Dsv4Trainable host(model_config(), train_options(), cfg.seed);
  LocalEngine local(host, cfg.optimizer, cfg.freeze);
  const TrainResult r = Trainer(cfg, out, local, *dat().ds, 1, trex::testing::quiet_trainer()).run();
  EXPECT_TRUE(r.resumed);
  EXPECT_EQ(r.start_step, 3);
  expect_continues_one_rank(out, "pp=2 -> CPU trainer", 2e-2);
}

namespace {

// The rank's engine, except that world rank `fail_rank` throws at the start of step `fail_step`'s forward.
struct FailingEngine final : StepEngine {
  FailingEngine(StepEngine& e, bool fails, int64_t at) : inner(e), fails(fails), fail_step(at) {}
  StepEngine& inner;
  bool fails;
  int64_t fail_step, step = 0;
  std::string describe() const override { return inner.describe(); }
  int64_t n_params() const override { return inner.n_params(); }
  int64_t n_trained() const override { return inner.n_trained(); }
  double flops_per_token(int64_t s) const override { return inner.flops_per_token(s); }
  int ranks() const override { return inner.ranks(); }
  bool lead() const override { return inner.lead(); }
  bool runs_micro_batch(int64_t m, int64_t n) const override { return inner.runs_micro_batch(m, n); }
  void begin_step(const StepControls& c) override {
    ++step;
    inner.begin_step(c);
  }
  EngineStep forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) override {
    if (fails && step == fail_step) throw std::runtime_error("injected failure in the stage's forward");
    return inner.forward_backward(mine, n_micro);
  }
  double clip_gradients() override { return inner.clip_gradients(); }
  void optimizer_step(double lr) override { inner.optimizer_step(lr); }
  void save(const fs::path& root, const TrainState& st, int64_t keep, const FaultHook& f) override {
    inner.save(root, st, keep, f);
  }
  TrainState load(const fs::path& dir) override { return inner.load(dir); }
  void barrier() override { inner.barrier(); }
  void max_over_ranks(double* v, int n) override { inner.max_over_ranks(v, n); }
};

}  // namespace

// Rank 3 (stage 1, DP rank 1) throws at step 2 while ranks 0..2 are in that step's pipeline transfers and DP
// reductions on the device: all three stop with "rank 3 failed: ..." well inside the 120 s timeout.
TEST(GpuMeshPipeline, AFailedRankStopsTheOthersNamingIt) {
  const TrainConfig cfg = run_config("{pp: 2, dp: 2, ep: 1}");
  const fs::path out = dat().dir / "rank3_fails";
  fs::remove_all(out);
  auto group = comm::make_thread_group(4, 120.0);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> err = trex::testing::run_ranks_collect(
      4,
      [&](int r) {
        GpuMeshEngine engine(cfg, model_config(), train_options(), *group[size_t(r)]);
        FailingEngine failing(engine, r == 3, 2);
        Trainer(cfg, out, failing, *dat().ds, 1, trex::testing::quiet_trainer()).run();
      },
      &group);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("  stopped after %.1f s: rank 0 '%s'\n", s, err[0].c_str());
  EXPECT_LT(s, 60.0) << "the ranks waited for the timeout instead of the abort";
  EXPECT_EQ(err[3], "injected failure in the stage's forward");
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(err[size_t(r)].find("rank 3 failed: injected failure"), std::string::npos)
        << "rank " << r << ": " << err[size_t(r)];
}
