// The GPU mesh engine (train/cuda/gpu_mesh_engine.h) on one rank (pp = dp = ep = 1, a parallel section) under the
// Trainer equals the one-GPU local engine (train/gpu_trainable.h) of the same config: every step's loss, gradient
// norm and target count (the same kernels in the same order: only the GPU backward's atomic-order noise differs),
// and its sharded checkpoint resumes: a run stopped at step 3 and continued by a fresh engine gives the
// uninterrupted run's step-4..6 losses.
// Several ranks need a communicator of several ranks on device buffers (NCCL refuses two ranks on one GPU): the
// dp / ep tests of this engine run over the thread-group communicator (issue 17).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/thread_group.h"
#include "data/shards.h"
#include "train/config.h"
#include "train/cuda/gpu_mesh_engine.h"
#include "train/dsv4_trainable.h"
#include "train/gpu_trainable.h"
#include "train/metrics.h"
#include "train/tiny_gpu_config.h"
#include "train/trainer.h"
#include "train/yaml.h"
#include "tiny_corpus.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Data = trex::testing::TinyCorpus;
std::vector<std::string> corpus_texts() {
  std::vector<std::string> t;
  for (int i = 0; i < 60; ++i)
    t.push_back("route " + std::to_string(i % 5) + " tokens to expert " + std::to_string(i % 3) + " of the mesh. ");
  return t;
}
Data& dat() {
  static Data d("trex_gpu_mesh", corpus_texts(), 300, 64);
  return d;
}

dsv4::ModelConfig model_config() {
  dsv4::ModelConfig c = trex::testing::tiny_gpu_config("tiny GPU mesh config");
  c.vocab_size = std::max<int64_t>(c.vocab_size, (dat().tok.vocab_size() + 63) / 64 * 64);
  return c;
}

Dsv4TrainOptions train_options() {
  Dsv4TrainOptions o;
  o.model.balance_alpha = 1e-4;
  o.model.use_mtp = false;
  o.bias_update_speed = 1e-3;
  return o;
}

const char* const kMuon = "optimizer: {kind: muon, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: false}}\n";

// The test run's config: `optimizer` is its optimiser line (a YAML key may appear once), `extra` more keys.
TrainConfig run_config(const std::string& extra = "", const std::string& optimizer = kMuon) {
  return parse_train_config(parse_yaml(optimizer + R"(
seed: 3
model: {type: dsv4}
data: {shards: x, tokenizer: y, seq_len: 64, batch_size: 2, grad_accum: 2}
schedule: {lr: 0.003, min_lr: 0.0003, warmup_steps: 2}
train: {max_steps: 6}
checkpoint: {every: 3, keep_last: 2}
logging: {plot: false}
)" + extra, "mesh.yaml"), "mesh.yaml");
}

TrainerOptions quiet(int64_t stop = -1) {
  TrainerOptions q;
  q.show_progress = false;
  q.stop_at = stop;
  return q;
}

TrainResult train_mesh(const fs::path& out, int64_t stop = -1) {
  const TrainConfig cfg = run_config("parallel: {pp: 1, dp: 1, ep: 1}\n");
  auto world = comm::make_local_communicator();
  GpuMeshEngine engine(cfg, model_config(), train_options(), *world);
  return Trainer(cfg, out, engine, *dat().ds, 1, quiet(stop)).run();
}

}  // namespace

TEST(GpuMeshEngine, OneRankEqualsTheLocalEngineAndResumesFromItsShardedCheckpoint) {
  ASSERT_TRUE(gpu_training_built());
  const fs::path local = dat().dir / "local", mesh = dat().dir / "mesh", resumed = dat().dir / "mesh_resumed";
  {
    const TrainConfig cfg = run_config();
    Dsv4Trainable host(model_config(), train_options(), cfg.seed);  // make_model's seed
    auto gpu = make_gpu_dsv4_trainable(host, train_options(), "test");
    Trainer(cfg, local, *gpu, *dat().ds, 1, quiet()).run();
  }
  const TrainResult rm = train_mesh(mesh);
  EXPECT_EQ(rm.end_step, 6);
  const auto ml = read_jsonl(local / "metrics.jsonl"), mm = read_jsonl(mesh / "metrics.jsonl");
  ASSERT_EQ(ml.size(), 6u);
  ASSERT_EQ(mm.size(), 6u);
  for (size_t i = 0; i < ml.size(); ++i) {
    const double a = ml[i]["loss"].get<double>(), b = mm[i]["loss"].get<double>();
    const double ga = ml[i]["grad_norm"].get<double>(), gb = mm[i]["grad_norm"].get<double>();
    std::printf("  step %zu: loss local %.6f mesh %.6f; grad norm local %.5f mesh %.5f\n", i + 1, a, b, ga, gb);
    EXPECT_LT(std::abs(a - b) / a, 1e-3) << "step " << i + 1;
    EXPECT_LT(std::abs(ga - gb) / ga, 1e-2) << "step " << i + 1;
    EXPECT_EQ(ml[i]["targets"], mm[i]["targets"]) << "step " << i + 1 << ": the data order differs";
    EXPECT_EQ(ml[i]["tokens"], mm[i]["tokens"]) << "step " << i + 1;
  }
  // The mesh writes the sharded manifest format.
  EXPECT_TRUE(fs::exists(mesh / "checkpoints" / "step_00000006" / "manifest.json"));

  train_mesh(resumed, 3);
  const TrainResult rr = train_mesh(resumed);
  EXPECT_TRUE(rr.resumed);
  EXPECT_EQ(rr.start_step, 3);
  const auto mr = read_jsonl(resumed / "metrics.jsonl");
  ASSERT_EQ(mr.size(), 6u);
  for (size_t i = 3; i < 6; ++i) {
    const double a = mm[i]["loss"].get<double>(), b = mr[i]["loss"].get<double>();
    EXPECT_LT(std::abs(a - b) / a, 1e-3) << "step " << i + 1 << ": resumed " << b << " vs uninterrupted " << a;
  }
}

// dp = 2 (ZeRO-1) as two threads on one GPU over the thread-group communicator (NCCL refuses two ranks on one
// device): the same Trainer loop, each rank its half of every step's micro-batches, gives the one-rank run's
// per-step losses, gradient norms and target counts for the same global batch (bf16 rounding and reduction order
// only), and writes one sharded checkpoint that the one-rank engine resumes.
TEST(GpuMeshEngine, TwoDataParallelRanksAsThreadsMatchOneRank) {
  ASSERT_TRUE(gpu_training_built());
  const std::string adamw =
      "optimizer: {kind: adamw, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: true}}\n";
  Dsv4TrainOptions o = train_options();
  o.model.balance_alpha = 0.0;  // not under dp on the GPU
  const fs::path one = dat().dir / "dp1", two = dat().dir / "dp2";
  {
    const TrainConfig cfg = run_config("parallel: {pp: 1, dp: 1, ep: 1}\n", adamw);
    auto world = comm::make_local_communicator();
    GpuMeshEngine engine(cfg, model_config(), o, *world);
    Trainer(cfg, one, engine, *dat().ds, 1, quiet()).run();
  }
  {
    const TrainConfig cfg = run_config("parallel: {pp: 1, dp: 2, ep: 1}\n", adamw);
    auto ranks = comm::make_thread_group(2, 120.0);
    std::string errors[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          GpuMeshEngine engine(cfg, model_config(), o, *ranks[size_t(r)]);
          Trainer(cfg, two, engine, *dat().ds, 1, quiet()).run();
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    ASSERT_TRUE(errors[0].empty() && errors[1].empty()) << "rank 0: " << errors[0] << "\nrank 1: " << errors[1];
  }
  const auto m1 = read_jsonl(one / "metrics.jsonl"), m2 = read_jsonl(two / "metrics.jsonl");
  ASSERT_EQ(m1.size(), 6u);
  ASSERT_EQ(m2.size(), 6u);
  for (size_t i = 0; i < m1.size(); ++i) {
    const double a = m1[i]["loss"].get<double>(), b = m2[i]["loss"].get<double>();
    const double ga = m1[i]["grad_norm"].get<double>(), gb = m2[i]["grad_norm"].get<double>();
    std::printf("  step %zu: loss dp=1 %.6f dp=2 %.6f; grad norm %.5f / %.5f\n", i + 1, a, b, ga, gb);
    EXPECT_LT(std::abs(a - b) / a, 5e-3) << "step " << i + 1;
    EXPECT_LT(std::abs(ga - gb) / ga, 5e-2) << "step " << i + 1;
    EXPECT_EQ(m1[i]["targets"], m2[i]["targets"]) << "step " << i + 1 << ": the global batch differs";
  }
  EXPECT_TRUE(fs::exists(two / "checkpoints" / "step_00000006" / "manifest.json"));
}
