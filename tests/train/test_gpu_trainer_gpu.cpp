// `trex train` on one GPU (train/gpu_trainable.h) through the same Trainer as the CPU:
//  - from the same initial weights and data order, the GPU run's per-step losses and gradient norms follow the fp32
//    CPU run to bf16 accuracy (Muon + AdamW groups, clipping, warm-up and decay, the balance loss at the V4 default
//    weight, the router-bias update), and the
//    loss falls;
//  - a GPU run stopped at step 3 and resumed by a new process-equivalent (a fresh GPU model) continues from its
//    checkpoint: the same step-4..6 losses as the uninterrupted GPU run (to the GPU backward's atomic-order noise);
//  - the checkpoint format is the CPU's: the CPU trainer resumes the GPU run's step-3 checkpoint and continues close
//    to it;
//  - what the GPU does not train (MTP, frozen tensors) is refused with the config key to change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "data/shards.h"
#include "train/config.h"
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
    t.push_back("minimise cost " + std::to_string(i % 7) + " x + " + std::to_string(i % 3) + " y subject to x >= " +
                std::to_string(i % 5) + " and y >= 1. ");
  return t;
}
Data& dat() {
  static Data d("trex_gpu_train", corpus_texts(), 300, 64);
  return d;
}

dsv4::ModelConfig model_config() {
  dsv4::ModelConfig c = trex::testing::tiny_gpu_config("tiny GPU trainer config");
  c.vocab_size = std::max<int64_t>(c.vocab_size, (dat().tok.vocab_size() + 63) / 64 * 64);
  return c;
}

Dsv4TrainOptions train_options() {
  Dsv4TrainOptions o;
  o.model.balance_alpha = 1e-4;  // the V4 default (its gradient is checked at a large weight in test_dsv4_gpu)
  o.model.use_mtp = false;
  o.bias_update_speed = 1e-3;
  return o;
}

TrainConfig run_config(const std::string& extra = "") {
  return parse_train_config(parse_yaml(R"(
seed: 3
model: {type: dsv4}
data: {shards: x, tokenizer: y, seq_len: 64, batch_size: 2, grad_accum: 2}
optimizer: {kind: muon, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: false}}
schedule: {lr: 0.003, min_lr: 0.0003, warmup_steps: 2}
train: {max_steps: 6}
checkpoint: {every: 3, keep_last: 2}
logging: {plot: false}
)" + extra, "gpu.yaml"), "gpu.yaml");
}

TrainerOptions quiet(int64_t stop = -1) {
  TrainerOptions q;
  q.show_progress = false;
  q.stop_at = stop;
  return q;
}

std::vector<json> metrics(const fs::path& run) { return read_jsonl(run / "metrics.jsonl"); }

TrainResult train_gpu(const fs::path& out, int64_t stop = -1) {
  Dsv4Trainable host(model_config(), train_options(), 1);
  auto gpu = make_gpu_dsv4_trainable(host, train_options(), "test");
  return Trainer(run_config(), out, *gpu, *dat().ds, 1, quiet(stop)).run();
}

}  // namespace

TEST(GpuTrainer, FollowsTheCpuTrainerResumesAndSharesItsCheckpointFormat) {
  ASSERT_TRUE(gpu_training_built());
  const fs::path cpu_run = dat().dir / "cpu", gpu_run = dat().dir / "gpu", resumed = dat().dir / "gpu_resumed",
                 crossed = dat().dir / "cpu_from_gpu";
  {
    Dsv4Trainable host(model_config(), train_options(), 1);
    Trainer(run_config(), cpu_run, host, *dat().ds, 1, quiet()).run();
  }
  const TrainResult rg = train_gpu(gpu_run);
  EXPECT_EQ(rg.end_step, 6);
  EXPECT_LT(rg.last_loss, rg.first_loss) << "the GPU run's loss does not fall";
  const auto mc = metrics(cpu_run), mg = metrics(gpu_run);
  ASSERT_EQ(mc.size(), 6u);
  ASSERT_EQ(mg.size(), 6u);
  for (size_t i = 0; i < mc.size(); ++i) {
    const double lc = mc[i]["loss"].get<double>(), lg = mg[i]["loss"].get<double>();
    const double gc = mc[i]["grad_norm"].get<double>(), gg = mg[i]["grad_norm"].get<double>();
    std::printf("  step %zu: loss CPU %.5f GPU %.5f (rel %.2e); grad norm CPU %.4f GPU %.4f\n", i + 1, lc, lg,
                std::abs(lg - lc) / lc, gc, gg);
    EXPECT_LT(std::abs(lg - lc) / lc, 2e-2) << "step " << i + 1;
    EXPECT_LT(std::abs(gg - gc) / gc, 0.1) << "step " << i + 1;
    EXPECT_EQ(mc[i]["targets"], mg[i]["targets"]) << "step " << i + 1 << ": the data order differs";
  }

  // Stop at 3, resume with a fresh GPU model from the checkpoint.
  train_gpu(resumed, 3);
  const TrainResult rr = train_gpu(resumed);
  EXPECT_TRUE(rr.resumed);
  EXPECT_EQ(rr.start_step, 3);
  const auto mr = metrics(resumed);
  ASSERT_EQ(mr.size(), 6u);
  for (size_t i = 3; i < 6; ++i) {
    const double a = mg[i]["loss"].get<double>(), b = mr[i]["loss"].get<double>();
    EXPECT_LT(std::abs(a - b) / a, 1e-3) << "step " << i + 1 << ": resumed " << b << " vs uninterrupted " << a;
  }

  // The CPU trainer continues the GPU run's step-3 checkpoint (same files, same names).
  fs::create_directories(crossed / "checkpoints");
  fs::copy(resumed / "checkpoints" / "step_00000003", crossed / "checkpoints" / "step_00000003",
           fs::copy_options::recursive);
  // The run's seed: the hash-routing tables come from it (as for export-hf), every trained value from the file.
  Dsv4Trainable host(model_config(), train_options(), 1);
  const TrainResult rc = Trainer(run_config(), crossed, host, *dat().ds, 1, quiet()).run();
  EXPECT_TRUE(rc.resumed);
  EXPECT_EQ(rc.start_step, 3);
  const auto mx = metrics(crossed);
  ASSERT_EQ(mx.size(), 3u);  // metrics of steps 1..3 stayed with the GPU run
  for (size_t i = 0; i < 3; ++i) {
    const double a = mg[i + 3]["loss"].get<double>(), b = mx[i]["loss"].get<double>();
    EXPECT_LT(std::abs(a - b) / a, 2e-2) << "step " << i + 4 << ": CPU from the GPU checkpoint " << b
                                         << " vs the GPU run " << a;
  }
}

TEST(GpuTrainer, RefusesWhatTheGpuDoesNotTrain) {
  auto refused = [](const dsv4::ModelConfig& mc, const Dsv4TrainOptions& o, const std::string& key) {
    Dsv4Trainable host(mc, o, 1);
    try {
      make_gpu_dsv4_trainable(host, o, "run.yaml");
      ADD_FAILURE() << "accepted a config the GPU cannot train (" << key << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  dsv4::ModelConfig with_mtp = model_config();
  with_mtp.n_mtp = 1;  // a config with an MTP block, trained with it (use_mtp true)
  Dsv4TrainOptions o = train_options();
  o.model.use_mtp = true;
  refused(with_mtp, o, "use_mtp");
  // The freeze list is refused by the updater.
  Dsv4Trainable host(model_config(), train_options(), 1);
  auto gpu = make_gpu_dsv4_trainable(host, train_options(), "run.yaml");
  try {
    gpu->make_updater(run_config().optimizer, {"embed.*"});
    ADD_FAILURE() << "accepted frozen parameters";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("freeze"), std::string::npos) << e.what();
  }
}
