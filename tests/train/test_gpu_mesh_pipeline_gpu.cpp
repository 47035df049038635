// Pipeline stages under the Trainer (train/cuda/gpu_mesh_pipeline.h: the GPU mesh engine with pp > 1), every rank
// a thread of this process on one GPU over the thread-group communicator (world rank = stage * dp + dp rank):
//  - pp = 2 (2 ranks), pp = 2 x dp = 2 (4 ranks), and with ep = 2 folded into dp = 2 (4 ranks) or dp = 4 (8
//    ranks) give the one-rank run of the same global batch (4 micro-batches
//    a step): every step's loss (the last stage's, summed over DP), gradient norm (the stages' squares summed)
//    and target count, with AdamW (decay on vectors too: every tensor's update depends on its own stage's
//    gradient only) and the router-bias update (each stage's loads); their checkpoints hold every tensor and
//    optimiser state of the one-rank run's exactly once (each stage writes its own);
//  - a pp = 2 run stopped at step 3 is continued by one rank from its sharded checkpoint: steps 4..6 give the
//    uninterrupted one-rank run's losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
      t.push_back("stage " + std::to_string(i % 4) + " passes tokens to stage " + std::to_string(i % 3) + ". ");
    return Data("trex_gpu_mesh_pp", t, 300, 64);
  }();
  return d;
}

dsv4::ModelConfig model_config() {
  dsv4::ModelConfig c = trex::testing::tiny_gpu_config("tiny GPU pipeline config");  // 3 layers: stages [0,2), [2,3)
  c.vocab_size = std::max<int64_t>(c.vocab_size, (dat().tok.vocab_size() + 63) / 64 * 64);
  return c;
}

Dsv4TrainOptions train_options() {
  Dsv4TrainOptions o;
  o.model.balance_alpha = 0.0;  // the balance loss runs in whole-model steps only
  o.model.use_mtp = false;      // the MTP module trains on the whole model only
  o.bias_update_speed = 1e-3;
  return o;
}

// 4 micro-batches of 2 sequences a step: one rank accumulates 4, pp = 2 runs 4 through its pipeline, pp = 2 x dp
// = 2 runs 2 through each DP index's pipeline.
TrainConfig run_config(const std::string& parallel) {
  return parse_train_config(parse_yaml(R"(
seed: 3
model: {type: dsv4, balance_alpha: 0, use_mtp: false}
data: {shards: x, tokenizer: y, seq_len: 64, batch_size: 2, grad_accum: 4}
optimizer: {kind: adamw, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: true}}
schedule: {lr: 0.003, min_lr: 0.0003, warmup_steps: 2}
train: {max_steps: 6}
checkpoint: {every: 3, keep_last: 2}
logging: {plot: false}
parallel: )" + parallel + "\n",
                                       "pp.yaml"),
                            "pp.yaml");
}

// `ranks` ranks of the config's layout as threads, under the Trainer (stop: TrainerOptions::stop_at).
void train_ranks(const TrainConfig& cfg, int ranks, const fs::path& out, int64_t stop = -1) {
  auto group = comm::make_thread_group(ranks, 120.0);
  trex::testing::run_ranks(ranks, [&](int r) {
    GpuMeshEngine engine(cfg, model_config(), train_options(), *group[size_t(r)]);
    TrainerOptions q;
    q.show_progress = false;
    q.stop_at = stop;
    Trainer(cfg, out, engine, *dat().ds, 1, q).run();
  });
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
  const auto m1 = read_jsonl(one / "metrics.jsonl"), m2 = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(m2.size(), 6u);
  for (size_t i = 0; i < m1.size(); ++i) {
    const double a = m1[i]["loss"].get<double>(), b = m2[i]["loss"].get<double>();
    const double ga = m1[i]["grad_norm"].get<double>(), gb = m2[i]["grad_norm"].get<double>();
    std::printf("  %s step %zu: loss one rank %.6f, pipeline %.6f; grad norm %.5f / %.5f\n", name.c_str(), i + 1, a,
                b, ga, gb);
    EXPECT_LT(std::abs(a - b) / a, 5e-3) << name << " step " << i + 1;
    EXPECT_LT(std::abs(ga - gb) / ga, 5e-2) << name << " step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], m2[i]["targets"]) << name << " step " << i + 1 << ": the global batch differs";
    // The pipeline's per-step timings, and 1F1B's ideal bubble of P stages over M micro-batches.
    const double M = 4.0 / double(ranks / stages);
    EXPECT_TRUE(m2[i].contains("pipeline_wait_s") && m2[i]["stage_forward_s"].get<double>() > 0) << m2[i].dump();
    EXPECT_NEAR(m2[i].value("bubble_fraction", -1.0), (stages - 1) / (M + stages - 1), 1e-12) << m2[i].dump();
  }
  EXPECT_LT(m2.back()["loss"].get<double>(), m2.front()["loss"].get<double>()) << name << ": the loss does not fall";
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

TEST(GpuMeshPipeline, OneRankContinuesATwoStageCheckpoint) {
  const fs::path& one = one_rank_run();
  const fs::path out = dat().dir / "pp2_then_one";
  train_ranks(run_config("{pp: 2, dp: 1, ep: 1}"), 2, out, 3);  // saved at step 3 (checkpoint every 3)
  if (HasFatalFailure()) return;
  ASSERT_TRUE(fs::exists(out / "checkpoints" / "step_00000003" / "manifest.json"));
  train_ranks(run_config("{pp: 1, dp: 1, ep: 1}"), 1, out);
  if (HasFatalFailure()) return;
  const auto m1 = read_jsonl(one / "metrics.jsonl"), mr = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(mr.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(mr[i]["step"], m1[i]["step"]);
    const double a = m1[i]["loss"].get<double>(), b = mr[i]["loss"].get<double>();
    std::printf("  step %zu: loss one rank %.6f, %s %.6f\n", i + 1, a, i < 3 ? "pp=2" : "resumed by one rank", b);
    EXPECT_LT(std::abs(a - b) / a, 5e-3) << "step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], mr[i]["targets"]) << "step " << i + 1 << ": the resumed data position differs";
  }
}
