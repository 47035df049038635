// The step engine of one process on the CPU: a Trainable (the CPU models) runs the step's micro-batches one after
// another and its ParamUpdater (the host optimiser) scales, clips, updates and writes the one-process checkpoint
// format. (GPU runs, one GPU included, use train/cuda/gpu_mesh_engine.h.)
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "train/param_updater.h"
#include "train/step_engine.h"
#include "train/trainable.h"

namespace trex::train {

class LocalEngine final : public StepEngine {
 public:
  // The model must outlive the engine. freeze: the run's freeze patterns (optim/param_groups.h).
  LocalEngine(Trainable& model, const optim::OptimizerConfig& opt, const std::vector<std::string>& freeze);

  std::string describe() const override { return model_.describe(); }
  int64_t n_params() const override { return upd_->n_params(); }
  int64_t n_trained() const override { return upd_->n_trained(); }
  double flops_per_token(int64_t seq_len) const override { return model_.flops_per_token(seq_len); }
  void begin_step(const StepControls& c) override;
  EngineStep forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) override;
  double clip_gradients() override { return upd_->clip_gradients(); }
  void optimizer_step(double lr) override;
  void save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
            const FaultHook& fault) override {
    upd_->save(root, st, keep_last, fault);
  }
  TrainState load(const std::filesystem::path& dir) override { return upd_->load(dir); }

 private:
  Trainable& model_;
  std::unique_ptr<ParamUpdater> upd_;
};

}  // namespace trex::train
