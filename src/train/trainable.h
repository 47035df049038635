// What the trainer needs from a model: a table of parameters (name, shape, fp32 value and gradient
// pointers, optimiser group), forward + backward on a batch, and a FLOPs count for MFU. Optimisers,
// clipping, checkpoints and the loop are written against this, so they are tested on a toy model and the
// DeepSeek-V4 model plugs in through an adapter (dsv4_trainable.h).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/batch.h"
#include "optim/param.h"
#include "train/param_updater.h"

namespace trex::train {

struct StepStats {
  double loss = 0;                     // the optimised loss (mean over targets, auxiliary terms included)
  int64_t n_targets = 0;
  std::map<std::string, double> parts; // e.g. lm, mtp, balance
};

struct StepControls {
  double mtp_weight = 0.3;
};

class Trainable {
 public:
  virtual ~Trainable() = default;
  // Stable order and stable pointers for the object's lifetime. Buffers (group Buffer) are checkpointed
  // but never optimised; frozen ones are checkpointed and not optimised.
  virtual std::vector<optim::ParamRef> params() = 0;
  virtual void zero_grads() = 0;
  // Forward and backward on one micro-batch: ADDS d(loss)/d(param) into the gradients.
  virtual StepStats forward_backward(const data::Batch& batch) = 0;
  virtual void set_controls(const StepControls&) {}
  // Called after each optimiser step (the DeepSeek-V4 adapter updates router biases here).
  virtual void after_optimizer_step() {}
  virtual double flops_per_token(int64_t seq_len) const = 0;  // training (3 x forward) FLOPs per token
  virtual std::string describe() const = 0;
  // What updates and checkpoints the parameters: by default the host optimiser over params(); a model whose
  // parameters, gradients and optimiser state live on an accelerator returns its own (param_updater.h).
  virtual std::unique_ptr<ParamUpdater> make_updater(const optim::OptimizerConfig& cfg,
                                                     const std::vector<std::string>& freeze) {
    return make_host_updater(params(), cfg, freeze);
  }
};

}  // namespace trex::train
