#include "train/mesh_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "optim/param_groups.h"
#include "parallel/zero1_optimizer.h"
#include "train/dsv4_trainable.h"
#include "train/sharded_checkpoint.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// pp = 1: the micro-batches run one after another through a Trainable.
class TrainableRankModel final : public RankModel {
 public:
  explicit TrainableRankModel(std::unique_ptr<Trainable> m)
      : m_(std::move(m)), dsv4_(dynamic_cast<Dsv4Trainable*>(m_.get())) {}
  std::vector<optim::ParamRef> params() override { return m_->params(); }
  void zero_grads() override { m_->zero_grads(); }
  void set_controls(const StepControls& c) override { m_->set_controls(c); }
  double run_micro_batches(const std::vector<data::Batch>& mbs, const std::function<void()>& before_final,
                           parallel::PipelineStepStats*) override {
    // Trainable::forward_backward adds the gradient of each micro-batch's mean loss; the 1 / M is applied
    // by the reduction (grad_scale), so accumulation matches trainer.cpp exactly.
    double loss = 0;
    for (size_t i = 0; i < mbs.size(); ++i) {
      if (i + 1 == mbs.size() && before_final) before_final();
      loss += m_->forward_backward(mbs[i]).loss;
    }
    return loss / double(mbs.size());
  }
  double grad_scale(int64_t n_micro) const override { return 1.0 / double(n_micro); }
  void set_grads_ready(GradsReady f) override {
    if (!dsv4_) return;
    if (!f) {
      dsv4_->model().set_grad_ready_hook(nullptr);
      return;
    }
    dsv4_->model().set_grad_ready_hook([f](int64_t, const std::vector<const dsv4::ParamInfo*>& ps) {
      std::vector<std::string> names;
      names.reserve(ps.size());
      for (const dsv4::ParamInfo* p : ps) names.push_back(p->name);
      f(names);
    });
  }
  void sum_expert_loads(comm::Communicator& dp) override {
    if (dsv4_) parallel::all_reduce_expert_loads(dp, dsv4_->expert_load_sums());
  }
  void after_optimizer_step() override { m_->after_optimizer_step(); }
  double flops_per_token(int64_t seq_len) const override { return m_->flops_per_token(seq_len); }
  std::string describe() const override { return m_->describe(); }

 private:
  std::unique_ptr<Trainable> m_;
  Dsv4Trainable* dsv4_;
};

// pp > 1: the pipeline executor runs the schedule over this rank's chunks.
class PipelinedRankModel final : public RankModel {
 public:
  PipelinedRankModel(StagedParts p, comm::Communicator& pp_group, const parallel::ScheduleSpec& spec)
      : p_(std::move(p)), ex_(pp_group, spec, p_.chunks) {}
  std::vector<optim::ParamRef> params() override { return p_.params(); }
  void zero_grads() override { p_.zero_grads(); }
  void set_controls(const StepControls& c) override {
    if (p_.set_controls) p_.set_controls(c);
  }
  double run_micro_batches(const std::vector<data::Batch>& mbs, const std::function<void()>& before_final,
                           parallel::PipelineStepStats* pipe) override {
    const auto& sched = ex_.schedule();
    TREX_CHECK(int64_t(mbs.size()) == sched.spec.micro_batches,
               "pipeline: {} micro-batches for a schedule of {}", mbs.size(), sched.spec.micro_batches);
    // The stages scale each micro-batch's loss by 1 / M, so gradients come out as trainer.cpp's.
    p_.feed(mbs, 1.0 / double(mbs.size()));
    // The rank's last backward: after it no gradient of this rank changes.
    const auto& acts = sched.ranks[size_t(rank_)];
    int64_t last_m = -1;
    int last_c = -1;
    for (const auto& a : acts)
      if (a.op == parallel::PipeOp::Backward) last_m = a.micro, last_c = a.chunk;
    parallel::PipelineStepStats st = ex_.run_step(true, [&](int64_t m, int c) {
      if (m == last_m && c == last_c && before_final) before_final();
    });
    if (pipe) *pipe = st;
    return st.loss;
  }
  void set_grads_ready(GradsReady f) override {
    if (p_.set_grads_ready) p_.set_grads_ready(std::move(f));
  }
  void sum_expert_loads(comm::Communicator& dp) override {
    if (p_.sum_expert_loads) p_.sum_expert_loads(dp);
  }
  void after_optimizer_step() override {
    if (p_.after_optimizer_step) p_.after_optimizer_step();
  }
  std::vector<std::string> stage_shared_params() const override { return p_.shared_params; }
  double flops_per_token(int64_t seq_len) const override { return p_.flops_per_token(seq_len); }
  std::string describe() const override { return p_.description; }
  void set_rank(int r) { rank_ = r; }

 private:
  StagedParts p_;
  parallel::PipelineExecutor ex_;
  int rank_ = 0;
};

// The optimiser of the run: ZeRO-1 over the mesh when there are several processes; the ordinary optimiser
// (identical updates, and the ordinary checkpoints) in one process.
struct RunOptimizer {
  std::unique_ptr<parallel::Zero1Optimizer> zero;
  std::unique_ptr<optim::Optimizer> plain;
  float grad_scale = 1.0f;
  std::vector<optim::ParamRef> trained;
  void begin(double scale) {
    if (zero) zero->begin_grad_sync(scale);
    else grad_scale = float(scale);
  }
  void finish() {
    if (zero) {
      zero->finish_grad_sync();
      return;
    }
    if (grad_scale != 1.0f)
      for (auto& p : trained)
        for (int64_t i = 0; i < p.numel(); ++i) p.grad[i] *= grad_scale;
  }
  double clip() { return zero ? zero->clip_gradients() : plain->clip_gradients(); }
  void step(double lr) { zero ? zero->step(lr) : plain->step(lr); }
};

}  // namespace

std::unique_ptr<RankModel> make_trainable_rank_model(std::unique_ptr<Trainable> model) {
  return std::make_unique<TrainableRankModel>(std::move(model));
}

std::unique_ptr<RankModel> make_pipelined_rank_model(StagedParts parts, comm::Communicator& pp_group,
                                                     const parallel::ScheduleSpec& spec) {
  TREX_CHECK(parts.feed && parts.params && parts.zero_grads && parts.flops_per_token,
             "pipelined model: feed, params, zero_grads and flops_per_token are required");
  auto m = std::make_unique<PipelinedRankModel>(std::move(parts), pp_group, spec);
  m->set_rank(pp_group.rank());
  return m;
}

struct MeshEngine::Opt : RunOptimizer {};

MeshEngine::MeshEngine(const TrainConfig& cfg, comm::Communicator& world, parallel::Mesh& mesh, RankModel& model)
    : cfg_(cfg), world_(world), mesh_(mesh), model_(model), opt_(std::make_unique<Opt>()) {
  const int D = mesh_.spec.dp, P = mesh_.spec.pp;
  TREX_CHECK(cfg_.grad_accum % D == 0, "{}: grad_accum {} is not a multiple of dp={}", cfg_.where, cfg_.grad_accum, D);
  params_ = model_.params();
  optim::apply_freeze(params_, cfg_.freeze);
  // A tensor shared by two stages (the head stage's copy of embed.weight) is optimised on the lower
  // stage only: the higher one sends its gradient down before the reduction and gets the value back after.
  shared_ = model_.stage_shared_params();
  for (const auto& name : shared_) {
    auto it = std::find_if(params_.begin(), params_.end(), [&](const optim::ParamRef& p) { return p.name == name; });
    TREX_CHECK(it != params_.end(), "rank {}: stage-shared tensor '{}' is not among the stage's parameters",
               world_.rank(), name);
    TREX_CHECK(mesh_.pp_rank == 0 || mesh_.pp_rank == P - 1,
               "rank {} (pipeline rank {}): stage-shared tensor '{}' on a middle stage is not supported",
               world_.rank(), mesh_.pp_rank, name);
    shared_refs_.push_back(*it);
    if (mesh_.pp_rank != 0 && it->trains()) it->group = optim::ParamGroup::Frozen;  // the copy: not optimised here
  }
  for (const auto& p : params_)
    if (p.trains()) opt_->trained.push_back(p);
  if (world_.size() > 1) {
    opt_->zero = std::make_unique<parallel::Zero1Optimizer>(params_, cfg_.optimizer, *mesh_.dp_group,
                                                            *mesh_.edp_group, P > 1 ? mesh_.pp_group.get() : nullptr);
    parallel::Zero1Optimizer* z = opt_->zero.get();
    model_.set_grads_ready([z, shared = shared_](const std::vector<std::string>& names) {
      if (shared.empty()) return z->on_grads_ready(names);
      std::vector<std::string> keep;  // shared tensors wait for their pipeline sum
      for (const auto& n : names)
        if (std::find(shared.begin(), shared.end(), n) == shared.end()) keep.push_back(n);
      z->on_grads_ready(keep);
    });
  } else {
    opt_->plain = std::make_unique<optim::Optimizer>(params_, cfg_.optimizer);
  }
}

MeshEngine::~MeshEngine() {
  if (opt_->zero) model_.set_grads_ready(nullptr);  // the hook points into the optimiser
}

std::string MeshEngine::describe() const {
  return fmt::format("{}: mesh pp={} dp={} ep={} vpp={} ({} schedule, {} micro-batches per DP rank){}",
                     model_.describe(), mesh_.spec.pp, mesh_.spec.dp, mesh_.spec.ep, mesh_.spec.vpp,
                     parallel::schedule_kind_name(cfg_.parallel.schedule), cfg_.grad_accum / mesh_.spec.dp,
                     opt_->zero ? ", ZeRO-1" : "");
}

int64_t MeshEngine::n_params() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

int64_t MeshEngine::n_trained() const {
  int64_t n = 0;
  for (const auto& p : opt_->trained) n += p.numel();
  return n;
}

bool MeshEngine::runs_micro_batch(int64_t micro, int64_t n_micro) const {
  return micro / (n_micro / mesh_.spec.dp) == mesh_.dp_rank;
}

void MeshEngine::begin_step(const StepControls& c) {
  model_.set_controls(c);
  model_.zero_grads();
}

EngineStep MeshEngine::forward_backward(const std::vector<data::Batch>& mbs, int64_t n_micro) {
  const int D = mesh_.spec.dp, P = mesh_.spec.pp;
  const int64_t M = n_micro / D;
  TREX_CHECK(int64_t(mbs.size()) == M, "rank {}: {} micro-batches for a DP share of {}", world_.rank(), mbs.size(), M);
  parallel::PipelineStepStats pipe;
  RunOptimizer& opt = *opt_;
  const double local = model_.run_micro_batches(mbs, [&] { opt.begin(model_.grad_scale(M)); }, &pipe);
  // Shared stage tensors: the upper copy's gradient joins the lower one before the DP reduction.
  for (auto& ref : shared_refs_) {
    const size_t bytes = size_t(ref.numel()) * sizeof(float);
    const int tag = 30000;
    if (mesh_.pp_rank == P - 1) {
      mesh_.pp_group->send(ref.grad, bytes, 0, tag)->wait();
    } else {
      std::vector<float> other(size_t(ref.numel()));
      mesh_.pp_group->recv(other.data(), bytes, P - 1, tag)->wait();
      for (int64_t i = 0; i < ref.numel(); ++i) ref.grad[i] += other[size_t(i)];
      if (opt.zero) opt.zero->on_grads_ready({ref.name});
    }
  }
  opt.finish();
  // Step loss: sum over stages and DP ranks of (1/M) x micro-batch losses, / dp = the single-process mean.
  int64_t targets = 0, tokens = 0;
  if (mesh_.pp_rank == 0)
    for (const auto& b : mbs) targets += b.n_targets, tokens += b.batch * b.seq;
  double red[3] = {local, double(targets), double(tokens)};
  world_.all_reduce(red, 3, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  EngineStep r;
  r.loss = red[0] / double(D);
  r.targets = int64_t(red[1]);
  r.tokens = int64_t(red[2]);
  if (P > 1) {
    r.slowest = {{"pipeline_bubble_s", pipe.bubble_s}, {"exposed_comm_s", pipe.exposed_comm_s},
                 {"pipeline_wait_s", pipe.wait_s}};
    r.extra = {{"bubble_fraction", pipe.bubble_fraction}};
  }
  return r;
}

double MeshEngine::clip_gradients() { return opt_->clip(); }

void MeshEngine::optimizer_step(double lr) {
  const int D = mesh_.spec.dp, P = mesh_.spec.pp;
  opt_->step(lr);
  for (auto& ref : shared_refs_) {  // the updated value back to the upper copy
    const size_t bytes = size_t(ref.numel()) * sizeof(float);
    if (mesh_.pp_rank == 0) mesh_.pp_group->send(ref.value, bytes, P - 1, 30001)->wait();
    else mesh_.pp_group->recv(ref.value, bytes, 0, 30001)->wait();
  }
  if (D > 1) model_.sum_expert_loads(*mesh_.dp_group);
  model_.after_optimizer_step();
}

void MeshEngine::save(const fs::path& root, const TrainState& st, int64_t keep_last, const FaultHook& fault) {
  if (opt_->plain) {
    save_checkpoint(root, st, params_, *opt_->plain, keep_last, fault);
    return;
  }
  ShardedSaveArgs sa;
  sa.keep_last = keep_last;
  sa.config = cfg_.raw;
  if (mesh_.pp_rank != 0) sa.not_written = shared_;  // the lower stage writes the shared tensor
  save_sharded_checkpoint(root, st, params_, *opt_->zero, mesh_, world_, sa);
}

TrainState MeshEngine::load(const fs::path& dir) {
  // Either format, saved by any layout: tensors are found by name (sharded_checkpoint.h).
  return opt_->plain ? load_checkpoint(dir, params_, *opt_->plain) : load_into_zero1(dir, params_, *opt_->zero);
}

void MeshEngine::max_over_ranks(double* v, int n) {
  world_.all_reduce(v, size_t(n), comm::ElemType::F64, comm::ReduceOp::Max)->wait();
}

}  // namespace trex::train
