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
      t.push_back("chunk " + std::to_string(i % 4) + " hands its stream to chunk " + std::to_string(i % 3) + ". ");
    return Data("trex_gpu_mesh_vpp", t, 300, 64);
  }();
  return d;
}

// The tiny GPU config with n layers (sliding / CSA / HCA repeated; layer 0 hash-routed).
dsv4::ModelConfig model_config(int64_t n) {
  nlohmann::json j = trex::testing::tiny_gpu_config_json();
  j["num_hidden_layers"] = n;
  nlohmann::json cr = nlohmann::json::array();
  for (int64_t l = 0; l < n; ++l) cr.push_back(std::vector<int>{0, 4, 16}[size_t(l % 3)]);
  j["compress_ratios"] = cr;
  dsv4::ModelConfig c = dsv4::parse_model_config(j, "tiny GPU interleaved-pipeline config");
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

// 4 micro-batches of 2 sequences a step (a multiple of pp for each DP rank: 4 at dp 1, 2 at dp 2).
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
                                       "vpp.yaml"),
                            "vpp.yaml");
}

void train_ranks(const TrainConfig& cfg, int64_t layers, int ranks, const fs::path& out, int64_t stop = -1) {
  auto group = comm::make_thread_group(ranks, 120.0);
  trex::testing::run_ranks(group, [&](int r) {  // a rank that throws aborts the group: the others stop too
    GpuMeshEngine engine(cfg, model_config(layers), train_options(), *group[size_t(r)]);
    TrainerOptions q;
    q.show_progress = false;
    q.stop_at = stop;
    Trainer(cfg, out, engine, *dat().ds, 1, q).run();
  });
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
  const auto m1 = read_jsonl(one / "metrics.jsonl"), m2 = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(m2.size(), 6u);
  for (size_t i = 0; i < m1.size(); ++i) {
    const double a = m1[i]["loss"].get<double>(), b = m2[i]["loss"].get<double>();
    const double ga = m1[i]["grad_norm"].get<double>(), gb = m2[i]["grad_norm"].get<double>();
    std::printf("  %s step %zu: loss one rank %.6f, interleaved %.6f; grad norm %.5f / %.5f\n", name.c_str(), i + 1,
                a, b, ga, gb);
    EXPECT_LT(std::abs(a - b) / a, 5e-3) << name << " step " << i + 1;
    EXPECT_LT(std::abs(ga - gb) / ga, 5e-2) << name << " step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], m2[i]["targets"]) << name << " step " << i + 1 << ": the global batch differs";
    const double M = 4.0 / double(ranks / stages);
    EXPECT_TRUE(m2[i].contains("pipeline_wait_s") && m2[i]["stage_forward_s"].get<double>() > 0) << m2[i].dump();
    EXPECT_NEAR(m2[i].value("bubble_fraction", -1.0), (stages - 1) / (vpp * M + stages - 1), 1e-12) << m2[i].dump();
  }
  EXPECT_LT(m2.back()["loss"].get<double>(), m2.front()["loss"].get<double>()) << name << ": the loss does not fall";
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
  const auto m1 = read_jsonl(one_rank_run(layers) / "metrics.jsonl"), mr = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(mr.size(), 6u) << what;
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(mr[i]["step"], m1[i]["step"]);
    const double a = m1[i]["loss"].get<double>(), b = mr[i]["loss"].get<double>();
    std::printf("  %s step %zu: loss one rank %.6f, %s %.6f\n", what.c_str(), i + 1, a, i < 3 ? "first" : "resumed",
                b);
    EXPECT_LT(std::abs(a - b) / a, tol) << what << " step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], mr[i]["targets"]) << what << " step " << i + 1 << ": the data position differs";
  }
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
