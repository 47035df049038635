// The training loop: micro-batches from the sampler, forward/backward through a Trainable, gradient
// accumulation, clipping by global norm, the scheduled optimiser step, loss-spike handling (skip the
// batch's update, or roll back to the last checkpoint and continue past the offending data), metrics,
// a progress bar (step, loss, tokens/s, MFU, ETA), periodic atomic checkpoints, and resume from the
// newest checkpoint in the output directory.
#pragma once
#include <cstdint>
#include <filesystem>

#include "data/shards.h"
#include "train/config.h"
#include "train/state_checkpoint.h"
#include "train/trainable.h"

namespace trex::train {

struct TrainerOptions {
  int64_t stop_at = -1;        // stop after this many total steps (-1: the config's max_steps)
  bool show_progress = true;
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
  Trainer(const TrainConfig& cfg, std::filesystem::path out_dir, Trainable& model, const data::ShardDataset& ds,
          int32_t pad_id, TrainerOptions opts = {});
  TrainResult run();

 private:
  bool is_spike(double loss, const std::vector<double>& history) const;
  TrainConfig cfg_;
  std::filesystem::path out_;
  Trainable& model_;
  const data::ShardDataset& ds_;
  int32_t pad_id_;
  TrainerOptions opts_;
};

}  // namespace trex::train
