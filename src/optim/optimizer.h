// The run's optimiser over a parameter table: Muon for the Muon group (each trailing 2-D slice of a
// tensor is its own matrix, so stacked experts are orthogonalised separately), AdamW for the AdamW group
// (and for the Muon group when the run selects plain AdamW). Frozen params and buffers are left alone.
// State (moments, momentum, step count) is fp32 and addressable by name for checkpoints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/param.h"
#include "optim/update_rules.h"

namespace trex::optim {

struct OptimizerConfig {
  std::string kind = "muon";  // "muon" (Muon + AdamW by group) or "adamw" (AdamW for everything)
  AdamWConfig adamw;
  MuonConfig muon;
  double muon_lr_scale = 1.0;  // Muon's lr = lr * muon_lr_scale (1 with the 0.18 RMS match)
  double clip_grad_norm = 1.0; // <= 0: no clipping
};

OptimizerConfig parse_optimizer_config(const nlohmann::json& j, const std::string& where);

// A named fp32 state tensor (points into the optimiser's storage).
struct StateTensor {
  std::string name;  // "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.momentum"
  Shape shape;
  float* data;
};

class Optimizer {
 public:
  Optimizer(std::vector<ParamRef> params, OptimizerConfig cfg);

  // Global L2 norm of all gradients of trainable params (before clipping).
  double grad_norm() const;
  // Scales gradients so that their global norm is at most cfg.clip_grad_norm; returns the norm before.
  double clip_gradients();
  // One update with learning rate lr; increments the step count.
  void step(double lr);

  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t s) { step_ = s; }
  std::vector<StateTensor> state_tensors();
  const std::vector<ParamRef>& params() const { return params_; }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  struct Slot {
    ParamRef p;
    bool use_muon = false;
    std::vector<float> m, v;  // AdamW moments, or m = Muon momentum
  };
  std::vector<Slot> slots_;
  std::vector<ParamRef> params_;
  OptimizerConfig cfg_;
  int64_t step_ = 0;
  std::vector<float> work_;
};

}  // namespace trex::optim
