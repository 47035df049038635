// The training loop, one for every layout and device: micro-batches from the seeded sampler (every rank draws
// the whole step's rows, so the data order does not depend on the layout), forward/backward through a step
// engine (step_engine.h: one process on the CPU or a GPU, or a rank of a mesh), gradient accumulation, clipping
// by the global norm, the scheduled optimiser step and router-bias update, loss-spike handling (skip the
// batch's update, or roll back to the last checkpoint and continue past the offending data), metrics.jsonl and
// loss.html, a progress bar (step, loss, tokens/s, MFU, ETA), periodic atomic checkpoints, and resume from the
// newest checkpoint in the output directory. Every decision is taken from values that are the same on every
// rank (the all-reduced loss, the global norm), so the ranks of a mesh stay in step.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>

#include "data/shards.h"
#include "train/config.h"
#include "train/state_checkpoint.h"
#include "train/step_engine.h"
#include "train/trainable.h"

namespace trex::train {

struct TrainerOptions {
  int64_t stop_at = -1;        // stop after this many total steps (-1: the config's max_steps)
  bool show_progress = true;   // the lead rank's progress bar
  FaultHook checkpoint_fault;  // tests: interrupt a checkpoint write
};

struct TrainResult {
  int64_t start_step = 0, end_step = 0;
  bool resumed = false;
  double first_loss = 0, last_loss = 0;
  int64_t spikes = 0, rollbacks = 0;
};

class Trainer {
 public:
  // Over any step engine (not owned).
  Trainer(const TrainConfig& cfg, std::filesystem::path out_dir, StepEngine& engine, const data::ShardDataset& ds,
          int32_t pad_id, TrainerOptions opts = {});
  // One process: the model through a LocalEngine (its updater is made when run() starts).
  Trainer(const TrainConfig& cfg, std::filesystem::path out_dir, Trainable& model, const data::ShardDataset& ds,
          int32_t pad_id, TrainerOptions opts = {});
  ~Trainer();
  TrainResult run();

 private:
  TrainConfig cfg_;
  std::filesystem::path out_;
  StepEngine* engine_ = nullptr;
  Trainable* model_ = nullptr;
  std::unique_ptr<StepEngine> own_;
  const data::ShardDataset& ds_;
  int32_t pad_id_;
  TrainerOptions opts_;
};

// The spike rule of SpikeConfig: a non-finite loss, or one above mean + z x sd and min_ratio x mean of the
// recent history (once it holds min_history losses).
bool is_loss_spike(const SpikeConfig& sc, double loss, const std::vector<double>& history);

}  // namespace trex::train
