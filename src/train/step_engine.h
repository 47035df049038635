// What differs between the ways a training step runs, behind one interface, so that the training loop
// (trainer.h: schedule, accumulation, clipping, spike skip / rollback, metrics, checkpoints, resume, progress) is
// written once for one process and many, CPU and GPU:
//   - how the step's micro-batches turn into gradients (one Trainable, or this rank's share of a mesh: data,
//     expert and pipeline parallel) and how those gradients are reduced and scaled;
//   - how the optimiser is held (whole on the host or a GPU, or sharded ZeRO-1 over data-parallel ranks);
//   - how a checkpoint is written (the one-process format, or the sharded manifest of a mesh) and read (either).
// Engines: local_engine.h (one process, a Trainable with its ParamUpdater: CPU or one GPU), mesh_engine.h (a
// rank of a device mesh over MPI).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "data/batch.h"
#include "train/state_checkpoint.h"
#include "train/trainable.h"

namespace trex::train {

// What one step's forward and backward produced, the same on every rank.
struct EngineStep {
  double loss = 0;                  // mean over the step's global batch (auxiliary terms included)
  int64_t tokens = 0, targets = 0;  // of the global batch
  // Per-step timings (seconds) the metrics report as the slowest rank's, e.g. a pipeline's bubble.
  std::vector<std::pair<std::string, double>> slowest;
  // Further per-step metrics fields (this rank's values), e.g. the pipeline's ideal bubble fraction.
  std::vector<std::pair<std::string, double>> extra;
};

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual std::string describe() const = 0;  // the model and the layout, for the run's first log line
  virtual int64_t n_params() const = 0;      // this rank's checkpointed values
  virtual int64_t n_trained() const = 0;
  virtual double flops_per_token(int64_t seq_len) const = 0;  // of the whole model (MFU)
  virtual int ranks() const { return 1; }                     // processes that share the step
  virtual bool lead() const { return true; }                  // the rank that writes metrics, events and plots

  // Whether this rank runs micro-batch `micro` of the step's n_micro (the loop draws every micro-batch's rows
  // in order, so the data order is the same whatever the layout, and builds only this rank's).
  virtual bool runs_micro_batch(int64_t micro, int64_t n_micro) const { return true; }
  // Before the step's forward: the schedule's controls, and zeroed gradients.
  virtual void begin_step(const StepControls& c) = 0;
  // Forward and backward of this rank's micro-batches (in step order), gradients reduced and scaled to those of
  // the global batch's mean loss (1 / n_micro x the sum of the micro-batch means).
  virtual EngineStep forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) = 0;
  // The global L2 norm of the trained gradients before clipping; clips to the configured norm (non-finite: no-op).
  virtual double clip_gradients() = 0;
  // The optimiser update, then what follows it (the router-bias update from the step's expert loads).
  virtual void optimizer_step(double lr) = 0;

  // Collective where several ranks share the step: every rank calls them alike.
  virtual void save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
                    const FaultHook& fault) = 0;
  virtual TrainState load(const std::filesystem::path& dir) = 0;  // a checkpoint of either format, any layout
  virtual void barrier() {}
  virtual void max_over_ranks(double* v, int n) {}  // element-wise maximum over the ranks, in place
};

}  // namespace trex::train
