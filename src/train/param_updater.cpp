#include "train/param_updater.h"

#include "optim/param_groups.h"

namespace trex::train {

namespace {

class HostParamUpdater final : public ParamUpdater {
 public:
  HostParamUpdater(std::vector<optim::ParamRef> params, const optim::OptimizerConfig& cfg)
      : params_(std::move(params)), opt_(params_, cfg) {}

  int64_t n_params() const override {
    int64_t n = 0;
    for (const auto& p : params_) n += p.numel();
    return n;
  }
  int64_t n_trained() const override {
    int64_t n = 0;
    for (const auto& p : params_)
      if (p.trains()) n += p.numel();
    return n;
  }
  void scale_grads(float s) override {
    for (auto& p : params_)
      if (p.trains())
        for (int64_t i = 0; i < p.numel(); ++i) p.grad[i] *= s;
  }
  double clip_gradients() override { return opt_.clip_gradients(); }
  void step(double lr) override { opt_.step(lr); }
  std::filesystem::path save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
                             const FaultHook& fault) override {
    return save_checkpoint(root, st, params_, opt_, keep_last, fault);
  }
  TrainState load(const std::filesystem::path& dir) override { return load_checkpoint(dir, params_, opt_); }

 private:
  std::vector<optim::ParamRef> params_;
  optim::Optimizer opt_;
};

std::vector<optim::ParamRef> frozen(std::vector<optim::ParamRef> params, const std::vector<std::string>& freeze) {
  optim::apply_freeze(params, freeze);
  return params;
}

}  // namespace

std::unique_ptr<ParamUpdater> make_host_updater(std::vector<optim::ParamRef> params,
                                                const optim::OptimizerConfig& cfg,
                                                const std::vector<std::string>& freeze) {
  return std::make_unique<HostParamUpdater>(frozen(std::move(params), freeze), cfg);
}

}  // namespace trex::train
