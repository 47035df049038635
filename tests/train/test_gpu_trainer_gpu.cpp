// `trex train` on one GPU: the GPU mesh engine of one rank (train/cuda/gpu_mesh_engine.h, a thread group of one
// rank as `trex train --device cuda` builds it without a launcher) through the same Trainer as the CPU:
//  - from the same initial weights and data order, the GPU run's per-step losses and gradient norms follow the fp32
//    CPU run to bf16 accuracy (Muon + AdamW groups, clipping, warm-up and decay, the balance loss at the V4 default
//    weight, the router-bias update), and the loss falls;
//  - a GPU run stopped at step 3 and resumed by a fresh engine continues from its checkpoint: the same step-4..6
//    losses as the uninterrupted GPU run (to the GPU backward's atomic-order noise);
//  - the checkpoint names are the CPU's: the CPU trainer resumes the GPU run's step-3 checkpoint and continues
//    close to it;
//  - the V4 SFT recipe (the MTP module with the schedule's weight, the router frozen) follows the CPU trainer the
//    same way; the frozen tensors end bit-identical to their initial values on both devices, keep no optimiser
//    state in the checkpoint, and the CPU trainer resumes the GPU's MTP checkpoint;
//  - a freeze pattern that matches nothing is refused as on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/thread_group.h"
#include "data/shards.h"
#include "optim/param_groups.h"
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

dsv4::ModelConfig model_config(int64_t n_mtp = 0) {
  dsv4::ModelConfig c = trex::testing::tiny_gpu_config("tiny GPU trainer config", n_mtp);
  c.vocab_size = std::max<int64_t>(c.vocab_size, (dat().tok.vocab_size() + 63) / 64 * 64);
  return c;
}

Dsv4TrainOptions train_options(bool mtp = false) {
  Dsv4TrainOptions o;
  o.model.balance_alpha = 1e-4;  // the V4 default (its gradient is checked at a large weight in test_dsv4_gpu)
  o.model.use_mtp = mtp;
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

// The SFT recipe: the router frozen (every gate weight, the MTP block's too), MTP trained with the schedule's
// weight (0.3 during warm-up, 0.1 once the decay starts at step 2).
const char* kFrozenRouter = "*.ffn.gate.weight";
TrainConfig recipe_config() { return run_config(std::string("freeze: [\"") + kFrozenRouter + "\"]\n"); }

TrainerOptions quiet(int64_t stop = -1) {
  TrainerOptions q;
  q.show_progress = false;
  q.stop_at = stop;
  return q;
}

std::vector<json> metrics(const fs::path& run) { return read_jsonl(run / "metrics.jsonl"); }

// Frozen tensor name -> its initial value (the seeded init every run starts from).
std::map<std::string, std::vector<float>> frozen_init(int64_t n_mtp, const Dsv4TrainOptions& o, uint64_t seed) {
  Dsv4Trainable init(model_config(n_mtp), o, seed);
  std::map<std::string, std::vector<float>> out;
  auto& t = init.model().params();
  for (const auto& e : t.entries())
    if (optim::glob_match(kFrozenRouter, e.name)) out[e.name].assign(t.value(e.name), t.value(e.name) + e.numel);
  return out;
}

bool bit_equal(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() == n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

// The one-GPU run as `trex train --device cuda` makes it: a mesh of one rank. frozen (optional): each frozen
// tensor's final value.
TrainResult train_gpu(const fs::path& out, const TrainConfig& cfg, int64_t n_mtp, const Dsv4TrainOptions& o,
                      int64_t stop = -1, std::map<std::string, std::vector<float>>* frozen = nullptr) {
  auto world = comm::make_thread_group(1, 120.0);
  GpuMeshEngine engine(cfg, model_config(n_mtp), o, *world[0]);
  const TrainResult r = Trainer(cfg, out, engine, *dat().ds, 1, quiet(stop)).run();
  if (frozen)
    for (auto& [name, v] : *frozen) v = engine.value(name);
  return r;
}

void expect_follows(const std::vector<json>& mc, const std::vector<json>& mg, double loss_tol, double norm_tol) {
  ASSERT_EQ(mc.size(), mg.size());
  for (size_t i = 0; i < mc.size(); ++i) {
    const double lc = mc[i]["loss"].get<double>(), lg = mg[i]["loss"].get<double>();
    const double gc = mc[i]["grad_norm"].get<double>(), gg = mg[i]["grad_norm"].get<double>();
    std::printf("  step %zu: loss CPU %.5f GPU %.5f (rel %.2e); grad norm CPU %.4f GPU %.4f\n", i + 1, lc, lg,
                std::abs(lg - lc) / lc, gc, gg);
    EXPECT_LT(std::abs(lg - lc) / lc, loss_tol) << "step " << i + 1;
    EXPECT_LT(std::abs(gg - gc) / gc, norm_tol) << "step " << i + 1;
    EXPECT_EQ(mc[i]["targets"], mg[i]["targets"]) << "step " << i + 1 << ": the data order differs";
  }
}

// The CPU trainer continues `run`'s step-3 checkpoint (copied to `crossed`): its steps 4..6 close to `run`'s.
void expect_cpu_resumes(const fs::path& run, const fs::path& crossed, const TrainConfig& cfg, int64_t n_mtp,
                        const Dsv4TrainOptions& o, const std::vector<json>& reference) {
  fs::create_directories(crossed / "checkpoints");
  fs::copy(run / "checkpoints" / "step_00000003", crossed / "checkpoints" / "step_00000003",
           fs::copy_options::recursive);
  // The run's seed: the hash-routing tables come from it (as for export-hf), every trained value from the file.
  Dsv4Trainable host(model_config(n_mtp), o, cfg.seed);
  const TrainResult rc = Trainer(cfg, crossed, host, *dat().ds, 1, quiet()).run();
  EXPECT_TRUE(rc.resumed);
  EXPECT_EQ(rc.start_step, 3);
  const auto mx = metrics(crossed);
  ASSERT_EQ(mx.size(), 3u);  // metrics of steps 1..3 stayed with the GPU run
  for (size_t i = 0; i < 3; ++i) {
    const double a = reference[i + 3]["loss"].get<double>(), b = mx[i]["loss"].get<double>();
    EXPECT_LT(std::abs(a - b) / a, 2e-2) << "step " << i + 4 << ": CPU from the GPU checkpoint " << b
                                         << " vs the GPU run " << a;
  }
}

}  // namespace

TEST(GpuTrainer, FollowsTheCpuTrainerResumesAndSharesItsCheckpointFormat) {
  const fs::path cpu_run = dat().dir / "cpu", gpu_run = dat().dir / "gpu", resumed = dat().dir / "gpu_resumed",
                 crossed = dat().dir / "cpu_from_gpu";
  const TrainConfig cfg = run_config();
  {
    Dsv4Trainable host(model_config(), train_options(), cfg.seed);  // make_model's seed, the GPU engine's too
    Trainer(cfg, cpu_run, host, *dat().ds, 1, quiet()).run();
  }
  const TrainResult rg = train_gpu(gpu_run, cfg, 0, train_options());
  EXPECT_EQ(rg.end_step, 6);
  EXPECT_LT(rg.last_loss, rg.first_loss) << "the GPU run's loss does not fall";
  const auto mc = metrics(cpu_run), mg = metrics(gpu_run);
  ASSERT_EQ(mc.size(), 6u);
  expect_follows(mc, mg, 2e-2, 0.1);

  // Stop at 3, resume with a fresh engine from the checkpoint.
  train_gpu(resumed, cfg, 0, train_options(), 3);
  const TrainResult rr = train_gpu(resumed, cfg, 0, train_options());
  EXPECT_TRUE(rr.resumed);
  EXPECT_EQ(rr.start_step, 3);
  const auto mr = metrics(resumed);
  ASSERT_EQ(mr.size(), 6u);
  for (size_t i = 3; i < 6; ++i) {
    const double a = mg[i]["loss"].get<double>(), b = mr[i]["loss"].get<double>();
    EXPECT_LT(std::abs(a - b) / a, 1e-3) << "step " << i + 1 << ": resumed " << b << " vs uninterrupted " << a;
  }
  expect_cpu_resumes(resumed, crossed, cfg, 0, train_options(), mg);
}

TEST(GpuTrainer, MtpAndFrozenRouterFollowTheCpuTrainer) {
  const fs::path cpu_run = dat().dir / "cpu_recipe", gpu_run = dat().dir / "gpu_recipe",
                 crossed = dat().dir / "cpu_from_gpu_recipe";
  const TrainConfig cfg = recipe_config();
  const Dsv4TrainOptions o = train_options(true);
  const auto init = frozen_init(1, o, cfg.seed);
  ASSERT_FALSE(init.empty());
  {
    Dsv4Trainable host(model_config(1), o, cfg.seed);
    Trainer(cfg, cpu_run, host, *dat().ds, 1, quiet()).run();
    for (const auto& [name, v] : init)
      EXPECT_TRUE(bit_equal(v, host.model().params().value(name), v.size())) << "CPU: frozen " << name << " moved";
  }
  std::map<std::string, std::vector<float>> gpu_final = init;
  const TrainResult rg = train_gpu(gpu_run, cfg, 1, o, -1, &gpu_final);
  EXPECT_EQ(rg.end_step, 6);
  EXPECT_LT(rg.last_loss, rg.first_loss) << "the GPU run's loss does not fall";
  for (const auto& [name, v] : init)
    EXPECT_TRUE(bit_equal(v, gpu_final[name].data(), gpu_final[name].size())) << "GPU: frozen " << name << " moved";
  expect_follows(metrics(cpu_run), metrics(gpu_run), 2e-2, 0.1);

  // The GPU checkpoint: the MTP block's tensors by the CPU's names, no optimiser state for frozen tensors.
  const CheckpointReader r(gpu_run / "checkpoints" / "step_00000006");
  const auto names = r.param_names();
  EXPECT_TRUE(std::count(names.begin(), names.end(), "mtp.0.ffn.gate.bias")) << "no MTP router bias";
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.rfind("mtp.0.", 0) == 0; }));
  for (const auto& [name, v] : init) {
    EXPECT_FALSE(r.has_optim(name + ".exp_avg") || r.has_optim(name + ".momentum")) << name << " has moments";
    EXPECT_TRUE(r.has_param(name)) << name;
  }
  expect_cpu_resumes(gpu_run, crossed, cfg, 1, o, metrics(gpu_run));
}

TEST(GpuTrainer, RefusesAFreezePatternThatMatchesNothing) {
  const TrainConfig cfg = run_config("freeze: [\"layers.*.no_such_tensor\"]\n");
  auto world = comm::make_thread_group(1, 120.0);
  try {
    GpuMeshEngine engine(cfg, model_config(), train_options(), *world[0]);
    ADD_FAILURE() << "accepted a freeze pattern that matches no parameter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.*.no_such_tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("freeze"), std::string::npos) << e.what();
  }
}
