// Interleaved pipeline stages under the Trainer (the GPU mesh engine with vpp > 1: each rank's chunks, one
// GpuModel each, walked by the interleaved schedule of parallel/pipeline_schedule.h), every rank a thread of this
// process on one GPU over the thread-group communicator (world rank = stage * dp + dp rank):
//  - pp = 2 x vpp = 2 (2 ranks, 4 virtual stages of a 4-layer model), x dp = 2 (4 ranks), x dp = 2 x ep = 2 give
//    the one-rank run of the same global batch (4 micro-batches a step): every step's loss, gradient norm and
//    target count within the 1F1B tests' bounds (test_gpu_mesh_pipeline_gpu.cpp), the interleaved schedule's
//    ideal bubble (P - 1) / (V M + P - 1); their checkpoints hold every tensor and optimiser state of the one-rank
//    run's exactly once, under the global names (each chunk writes its own);
//  - padding: a 10-layer model on pp = 2 x vpp = 2 with parallel.pad_layers 2 (virtual stages of 3, 3, 3 and
//    1 + 2 no-op layers) gives its own one-rank run;
//  - resume across layouts: pp = 2 x vpp = 2 stopped at step 3, continued by one rank, and by pp = 2 (1F1B).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"
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
  static Data d("trex_gpu_mesh_vpp", trex::testing::corpus_lines([](int i) {
                  return "chunk " + std::to_string(i % 4) + " hands its stream to chunk " + std::to_string(i % 3) + ". ";
                }),
                300, 64);
  return d;
}

// The tiny GPU config with n layers (sliding / CSA / HCA repeated; layer 0 hash-routed).
dsv4::ModelConfig model_config(int64_t n) {
  return trex::testing::with_corpus_vocab(
      trex::testing::tiny_gpu_config_layers(n, "tiny GPU interleaved-pipeline config"), dat().tok);
}

// The balance loss runs in whole-model steps only; the MTP module trains on the whole model only.
Dsv4TrainOptions train_options() { return trex::testing::layout_train_options(false); }

// 4 micro-batches of 2 sequences a step (a multiple of pp for each DP rank: 4 at dp 1, 2 at dp 2).
TrainConfig run_config(const std::string& parallel) {
  trex::testing::LayoutRunYaml y;
  y.model = "{type: dsv4, balance_alpha: 0, use_mtp: false}";
  y.grad_accum = 4;
  return trex::testing::layout_run_config(y, "parallel: " + parallel + "\n", "vpp.yaml");
}

void train_ranks(const TrainConfig& cfg, int64_t layers, int ranks, const fs::path& out, int64_t stop = -1) {
  trex::testing::train_on_thread_ranks(cfg, model_config(layers), train_options(), *dat().ds, ranks, out, stop);
}

const fs::path& one_rank_run(int64_t layers) {  // the references: one rank, 6 steps
  static std::map<int64_t, fs::path> done;
  auto it = done.find(layers);
  if (it != done.end()) return it->second;
  const fs::path o = dat().dir / ("one_" + std::to_string(layers));
  fs::remove_all(o);
  train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), layers, 1, o);
  return done[layers] = o;
}

void expect_matches_one_rank(const std::string& name, const std::string& parallel, int64_t layers, int ranks,
                             int stages, int vpp) {
  const fs::path& one = one_rank_run(layers);
  if (::testing::Test::HasFatalFailure()) return;
  const fs::path out = dat().dir / name;
  fs::remove_all(out);
  train_ranks(run_config(parallel), layers, ranks, out);
  if (::testing::Test::HasFatalFailure()) return;
  // Every step within the 1F1B tests' bounds; the pipeline's timings and the interleaved schedule's ideal bubble.
  const double M = 4.0 / double(ranks / stages);
  trex::testing::expect_steps_match(one, out, name, 0, 6, trex::testing::kLayoutStepBounds,
                                    [&](size_t, const nlohmann::json&, const nlohmann::json& got) {
                                      EXPECT_TRUE(got.contains("pipeline_wait_s") &&
                                                  got["stage_forward_s"].get<double>() > 0)
                                          << got.dump();
                                      EXPECT_NEAR(got.value("bubble_fraction", -1.0),
                                                  (stages - 1) / (vpp * M + stages - 1), 1e-12)
                                          << got.dump();
                                    });
  if (::testing::Test::HasFatalFailure()) return;
  trex::testing::expect_loss_falls(out, name);
  // Every chunk wrote its own tensors under their global names: together the one-rank checkpoint's names, each
  // once (the manifest refuses a name written twice).
  const fs::path ck = out / "checkpoints" / "step_00000006";
  ASSERT_TRUE(fs::exists(ck / "manifest.json")) << ck;
  const CheckpointReader mine(ck), ref(one / "checkpoints" / "step_00000006");
  EXPECT_EQ(mine.param_names(), ref.param_names()) << name;
  EXPECT_EQ(mine.optim_names(), ref.optim_names()) << name;
  EXPECT_EQ(mine.optimizer_steps(), 6);
}

// Steps 1..3 from the first layout, 4..6 from the layout that resumed its step-3 checkpoint, against the
// uninterrupted one-rank run.
void expect_continues_one_rank(const fs::path& out, int64_t layers, const std::string& what, double tol) {
  trex::testing::expect_resumed_run_matches(one_rank_run(layers), out, what, tol);
}

}  // namespace

TEST(GpuMeshVpp, TwoStagesOfTwoChunksMatchOneRank) {
  expect_matches_one_rank("pp2_vpp2", "{pp: 2, dp: 1, ep: 1, vpp: 2}", 4, 2, 2, 2);
}

TEST(GpuMeshVpp, TwoStagesOfTwoChunksTimesTwoDataParallelRanksMatchOneRank) {
  expect_matches_one_rank("pp2_vpp2_dp2", "{pp: 2, dp: 2, ep: 1, vpp: 2}", 4, 4, 2, 2);
}

// Expert parallelism folded into each stage's DP ranks: both chunks of a rank hold half of their layers' experts.
TEST(GpuMeshVpp, TwoStagesOfTwoChunksTimesTwoDataParallelWithTwoExpertParallelMatchOneRank) {
  expect_matches_one_rank("pp2_vpp2_dp2_ep2", "{pp: 2, dp: 2, ep: 2, vpp: 2}", 4, 4, 2, 2);
}

// 10 layers + 2 no-op padding layers = 12 slots: virtual stages [0,3), [3,6), [6,9), [9,10) + 2 no-op (without the
// padding: 3, 3, 2, 2 layers).
TEST(GpuMeshVpp, PaddedChunksMatchOneRank) {
  expect_matches_one_rank("pp2_vpp2_pad2", "{pp: 2, dp: 1, ep: 1, vpp: 2, pad_layers: 2}", 10, 2, 2, 2);
}

TEST(GpuMeshVpp, OneRankContinuesAnInterleavedCheckpoint) {
  const fs::path out = dat().dir / "vpp2_then_one";
  fs::remove_all(out);
  one_rank_run(4);
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1, vpp: 2}"), 4, 2, out, 3);  // saved at step 3 (checkpoint every 3)
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fs::exists(out / "checkpoints" / "step_00000003" / "manifest.json"));
  train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 4, 1, out);
  if (HasFatalFailure()) return;
  expect_continues_one_rank(out, 4, "pp=2 x vpp=2 -> one rank", 5e-3);
}

TEST(GpuMeshVpp, OneFOneBStagesContinueAnInterleavedCheckpoint) {
  const fs::path out = dat().dir / "vpp2_then_pp2";
  fs::remove_all(out);
  one_rank_run(4);
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1, vpp: 2}"), 4, 2, out, 3);
  if (HasFatalFailure()) return;
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1}"), 4, 2, out);
  if (HasFatalFailure()) return;
  expect_continues_one_rank(out, 4, "pp=2 x vpp=2 -> pp=2", 5e-3);
}
