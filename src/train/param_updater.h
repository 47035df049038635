// How the training loop updates and persists a model's parameters, wherever they live. The host updater keeps
// fp32 values, gradients and the optimiser state in host memory (optim::Optimizer over Trainable::params(), the
// native checkpoint of state_checkpoint.h); a model that keeps all of it elsewhere may bring its own updater with
// the same checkpoint format. (The GPU trainer is a step engine of its own, train/cuda/gpu_mesh_engine.h, whose
// checkpoints share the tensor names, so a run moves between the CPU and a GPU and `trex export-hf` reads either.)
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "train/state_checkpoint.h"

namespace trex::train {

class ParamUpdater {
 public:
  virtual ~ParamUpdater() = default;
  virtual int64_t n_params() const = 0;   // checkpointed values (buffers included)
  virtual int64_t n_trained() const = 0;  // values the optimiser updates
  // Multiplies every trained gradient by s (the 1 / grad_accum of an accumulated step). An updater may defer the
  // multiply into the next step() (the GPU one does); norms and updates are those of the scaled gradients.
  virtual void scale_grads(float s) = 0;
  // The global L2 norm of the trained gradients before clipping; scales them to the configured clip norm when
  // above it (a non-finite norm is returned and nothing is scaled).
  virtual double clip_gradients() = 0;
  virtual void step(double lr) = 0;  // one optimiser update from the (scaled) gradients; counts the step
  // The native checkpoint DIR/step_NNNNNNNN (atomic, keeps the newest keep_last).
  virtual std::filesystem::path save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
                                     const FaultHook& fault) = 0;
  // Values, optimiser state and step count from a checkpoint of either format (one-process or sharded).
  virtual TrainState load(const std::filesystem::path& dir) = 0;
};

// The host updater: optim::Optimizer over params (with the run's freeze patterns applied).
std::unique_ptr<ParamUpdater> make_host_updater(std::vector<optim::ParamRef> params,
                                                const optim::OptimizerConfig& cfg,
                                                const std::vector<std::string>& freeze);

}  // namespace trex::train
