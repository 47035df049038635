#include "train/local_engine.h"

namespace trex::train {

LocalEngine::LocalEngine(Trainable& model, const optim::OptimizerConfig& opt, const std::vector<std::string>& freeze)
    : model_(model), upd_(model.make_updater(opt, freeze)) {}

void LocalEngine::begin_step(const StepControls& c) {
  model_.set_controls(c);
  model_.zero_grads();
}

EngineStep LocalEngine::forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) {
  EngineStep r;
  for (const data::Batch& b : mine) {
    const StepStats s = model_.forward_backward(b);  // adds the gradient of this micro-batch's mean loss
    r.loss += s.loss / double(n_micro);
    r.tokens += b.batch * b.seq;
    r.targets += b.n_targets;
  }
  if (n_micro > 1) upd_->scale_grads(float(1.0 / double(n_micro)));
  return r;
}

void LocalEngine::optimizer_step(double lr) {
  upd_->step(lr);
  model_.after_optimizer_step();
}

}  // namespace trex::train
