// `trex train` on one GPU: the Trainable and ParamUpdater over the GPU step engine of one rank
// (train/cuda/gpu_step_engine.h, the step `trex bench train` times), see train/gpu_trainable.h.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/dsv4/moe.h"
#include "optim/param_groups.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_step_engine.h"
#include "train/gpu_trainable.h"
#include "train/sharded_checkpoint.h"

namespace trex::train {

bool gpu_training_built() { return true; }

namespace {

using json = nlohmann::json;

// A checkpointed tensor: name, shape and optimiser group.
struct Entry {
  std::string name;
  Shape shape;
  optim::ParamGroup group;
};

class GpuDsv4Trainable;

// Clipping, the optimiser step and checkpoints of the GPU model, in the host updater's format and names.
class GpuParamUpdater final : public ParamUpdater {
 public:
  GpuParamUpdater(GpuStepEngine& engine, std::vector<Entry> params, std::vector<Entry> buffers,
                  const optim::OptimizerConfig& cfg)
      : eng_(engine), gpu_(engine.model()), opt_(engine.optimizer()), params_(std::move(params)),
        buffers_(std::move(buffers)), cfg_(cfg) {}

  int64_t n_params() const override { return n_trained() + count(buffers_); }
  int64_t n_trained() const override { return count(params_); }
  // Scaling (accumulation's 1 / micro-batches, clipping) is not a pass over the 4 B/parameter gradients of its own:
  // it is folded into the optimiser's read of them (GpuOptimizer::step's grad_scale), which makes the same
  // fp32 products, and the norm is taken of the unscaled gradients times the pending scale.
  void scale_grads(float s) override { pending_scale_ *= s; }
  double clip_gradients() override {
    const double norm = gpu_.grad_norm() * double(pending_scale_);
    if (cfg_.clip_grad_norm > 0 && norm > cfg_.clip_grad_norm && std::isfinite(norm))
      pending_scale_ *= float(cfg_.clip_grad_norm / (norm + 1e-6));  // as optim::Optimizer::clip_gradients
    return norm;
  }
  void step(double lr) override {
    eng_.optimizer_step(cfg_, lr, ++steps_, pending_scale_);
    pending_scale_ = 1.f;
  }

  std::filesystem::path save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
                             const FaultHook& fault) override {
    std::vector<ckpt::TensorToWrite> model, optim;
    json groups = json::object();
    auto from_host = [](std::vector<float> v) {  // a producer copying a host vector into the file's buffer
      return [v = std::move(v)](void* dst) { std::memcpy(dst, v.data(), v.size() * sizeof(float)); };
    };
    for (const Entry& p : params_) {
      dsv4gpu::GpuModel* g = &gpu_;
      dsv4gpu::GpuOptimizer* o = &opt_;
      const std::string name = p.name;
      model.push_back({p.name, DType::F32, p.shape, nullptr, [g, name](void* dst) {
                         const std::vector<float> v = g->value(name);
                         std::memcpy(dst, v.data(), v.size() * sizeof(float));
                       }});
      groups[p.name] = std::string(optim::group_name(p.group));
      for (const auto& [suffix, which] : state_names(p)) {
        optim.push_back({p.name + suffix, DType::F32, p.shape, nullptr, [o, name, which = which](void* dst) {
                           const std::vector<float> v = o->state(name, which);
                           std::memcpy(dst, v.data(), v.size() * sizeof(float));
                         }});
      }
    }
    for (const Entry& b : buffers_) {
      model.push_back({b.name, DType::F32, b.shape, nullptr, from_host(gpu_.router_bias(b.name))});
      groups[b.name] = std::string(optim::group_name(b.group));
    }
    return save_checkpoint_tensors(root, st, model, optim, steps_, groups, keep_last, fault);
  }

  TrainState load(const std::filesystem::path& dir) override {
    const CheckpointReader r(dir);
    std::vector<float> buf;
    for (const Entry& p : params_) {
      buf.assign(size_t(numel(p.shape)), 0.f);
      r.read_param(p.name, p.shape, buf.data());
      gpu_.set_value(p.name, buf);
      for (const auto& [suffix, which] : state_names(p)) {
        r.read_optim(p.name + suffix, p.shape, buf.data());
        opt_.set_state(p.name, which, buf);
      }
    }
    for (const Entry& b : buffers_) {
      buf.assign(size_t(numel(b.shape)), 0.f);
      r.read_param(b.name, b.shape, buf.data());
      gpu_.set_router_bias(b.name, buf);
    }
    steps_ = r.optimizer_steps();
    return r.state();
  }

 private:
  static int64_t count(const std::vector<Entry>& v) {
    int64_t n = 0;
    for (const Entry& e : v) n += numel(e.shape);
    return n;
  }
  // The optimiser state names of one parameter (optim::Optimizer::state_tensors) and the GPU moment holding each.
  std::vector<std::pair<std::string, int>> state_names(const Entry& p) const {
    if (cfg_.kind == "muon" && p.group == optim::ParamGroup::Muon) return {{".momentum", 0}};
    return {{".exp_avg", 0}, {".exp_avg_sq", 1}};
  }

  GpuStepEngine& eng_;
  dsv4gpu::GpuModel& gpu_;
  dsv4gpu::GpuOptimizer& opt_;  // its moments, in the model's master layout
  std::vector<Entry> params_, buffers_;
  optim::OptimizerConfig cfg_;
  int64_t steps_ = 0;
  float pending_scale_ = 1.f;  // applied to the gradients by the next step()
};

class GpuDsv4Trainable final : public Trainable {
 public:
  GpuDsv4Trainable(Dsv4Trainable& host, const Dsv4TrainOptions& opts, const std::string& where)
      : opts_(opts), where_(where) {
    cfg_ = host.model().config();
    TREX_CHECK(cfg_.n_mtp == 0 || !opts.model.use_mtp,
               "{}: device cuda: the GPU trainer does not train the MTP module yet (its loss parts and MTP router "
               "bias are not wired here; dsv4gpu::GpuModel itself trains it); set model.use_mtp: false", where);
    cfg_.n_mtp = 0;  // the host model declared no MTP tensors either (use_mtp false)
    int n_dev = 0;
    const cudaError_t e = cudaGetDeviceCount(&n_dev);
    TREX_CHECK(e == cudaSuccess && n_dev > 0, "{}: device cuda: no usable CUDA device ({}); train with device cpu",
               where, e == cudaSuccess ? std::string("none found") : std::string(cudaGetErrorString(e)));
    dsv4gpu::GpuModelOptions go;
    go.balance_alpha = opts.model.balance_alpha, go.balance_hash_layers = opts.model.balance_hash_layers;
    go.recompute = opts.recompute;
    eng_ = std::make_unique<GpuStepEngine>(cfg_, GpuLayout{}, go);
    gpu_ = &eng_->model();
    const auto& table = host.model().params();
    const std::vector<std::string> names = gpu_->param_names();
    const std::set<std::string> on_gpu(names.begin(), names.end());
    for (const auto& e : table.entries()) {
      TREX_CHECK(on_gpu.count(e.name), "{}: device cuda: the GPU model has no tensor '{}'", where, e.name);
      params_.push_back({e.name, e.shape, optim::dsv4_param_group(e.name, e.shape)});
    }
    TREX_CHECK(params_.size() == names.size(), "{}: device cuda: the host model has {} tensors, the GPU model {}",
               where, params_.size(), names.size());
    for (const auto& [name, b] : table.bias)
      buffers_.push_back({name, {int64_t(b.size())}, optim::ParamGroup::Buffer});
    gpu_->load_from(table);
    load_sum_.assign(size_t(cfg_.n_layers), std::vector<int64_t>(size_t(cfg_.n_routed_experts), 0));
  }

  std::vector<optim::ParamRef> params() override {
    fail("{}: device cuda: the parameters live on the GPU (the trainer reaches them through make_updater)", where_);
  }
  void zero_grads() override {
    eng_->zero_grads();
    for (auto& l : load_sum_) std::fill(l.begin(), l.end(), 0);
  }
  StepStats forward_backward(const data::Batch& b) override {
    const dsv4::SeqLayout layout = batch_layout(b);
    StepStats s;
    s.loss = eng_->forward_backward(b.input_ids.data(), b.labels.data(), layout,
                                    [&] { add_expert_loads(layout.n_tokens()); });
    s.n_targets = b.n_targets;  // s.loss: the LM loss plus the balance loss (the GPU model returns their sum)
    return s;
  }
  void after_optimizer_step() override {
    if (opts_.bias_update_speed == 0) return;
    for (const Entry& b : buffers_) {
      const int64_t l = layer_of(b.name);
      std::vector<float> bias = gpu_->router_bias(b.name);
      dsv4::router_bias_update(bias.data(), load_sum_[size_t(l)].data(), int64_t(bias.size()),
                               opts_.bias_update_speed);
      gpu_->set_router_bias(b.name, bias);
    }
  }
  double flops_per_token(int64_t seq_len) const override { return dsv4_flops_per_token(cfg_, seq_len); }
  std::string describe() const override {
    return fmt::format("DeepSeek-V4 on CUDA (hidden {}, {} layers, {} experts top-{}, vocab {}, {} parameters)",
                       cfg_.hidden, cfg_.n_layers, cfg_.n_routed_experts, cfg_.topk, cfg_.vocab_size,
                       gpu_->n_params());
  }
  std::unique_ptr<ParamUpdater> make_updater(const optim::OptimizerConfig& cfg,
                                             const std::vector<std::string>& freeze) override {
    TREX_CHECK(freeze.empty(), "{}: device cuda: frozen parameters (freeze) are not implemented on the GPU",
               where_);
    return std::make_unique<GpuParamUpdater>(*eng_, params_, buffers_, cfg);
  }

 private:
  // "layers.L.ffn.gate.bias" -> L.
  int64_t layer_of(const std::string& name) const {
    int64_t l = -1;
    TREX_CHECK(std::sscanf(name.c_str(), "layers.%ld.", &l) == 1 && l >= 0 && l < cfg_.n_layers,
               "{}: device cuda: unexpected router bias '{}'", where_, name);
    return l;
  }
  // The step's tokens per expert of every score-routed layer (the bias update's input), from the selections of
  // the forward just run.
  void add_expert_loads(int64_t n_tok) {
    std::vector<int64_t> load(size_t(cfg_.n_routed_experts));
    for (const Entry& b : buffers_) {
      const int64_t l = layer_of(b.name);
      const std::vector<int32_t> sel = gpu_->router_selection(l);
      dsv4::moe_expert_load(sel.data(), n_tok, cfg_.topk, cfg_.n_routed_experts, load.data());
      for (size_t e = 0; e < load.size(); ++e) load_sum_[size_t(l)][e] += load[e];
    }
  }

  Dsv4TrainOptions opts_;
  std::string where_;
  dsv4::ModelConfig cfg_;
  std::unique_ptr<GpuStepEngine> eng_;  // one GPU: the model and its optimiser
  dsv4gpu::GpuModel* gpu_ = nullptr;
  std::vector<Entry> params_, buffers_;
  std::vector<std::vector<int64_t>> load_sum_;  // per layer, summed over the step's micro-batches
};

}  // namespace

std::unique_ptr<Trainable> make_gpu_dsv4_trainable(Dsv4Trainable& host, const Dsv4TrainOptions& opts,
                                                   const std::string& where) {
  return std::make_unique<GpuDsv4Trainable>(host, opts, where);
}

}  // namespace trex::train
