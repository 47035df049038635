#include "train/distributed_trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/sampler.h"
#include "optim/param_groups.h"
#include "parallel/zero1_optimizer.h"
#include "train/dsv4_trainable.h"
#include "train/metrics.h"
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

bool is_spike(const SpikeConfig& sc, double loss, const std::vector<double>& h) {
  if (!std::isfinite(loss)) return true;
  if (int64_t(h.size()) < sc.min_history) return false;
  double mean = 0, var = 0;
  for (double x : h) mean += x;
  mean /= double(h.size());
  for (double x : h) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / double(h.size()));
  return loss > mean + sc.z_threshold * sd && loss > sc.min_ratio * mean;
}

std::string human_rate(double r) {
  if (r >= 1e6) return fmt::format("{:.2f}M", r / 1e6);
  if (r >= 1e3) return fmt::format("{:.1f}k", r / 1e3);
  return fmt::format("{:.0f}", r);
}

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

DistributedTrainer::DistributedTrainer(const TrainConfig& cfg, fs::path out_dir, comm::Communicator& world,
                                       parallel::Mesh& mesh, RankModel& model, const data::ShardDataset& ds,
                                       int32_t pad_id, DistributedOptions opts)
    : cfg_(cfg), out_(std::move(out_dir)), world_(world), mesh_(mesh), model_(model), ds_(ds), pad_id_(pad_id),
      opts_(std::move(opts)) {}

TrainResult DistributedTrainer::run() {
  const bool lead = world_.rank() == 0;
  const int D = mesh_.spec.dp, P = mesh_.spec.pp;
  const int64_t A = cfg_.grad_accum, M = A / D;
  TREX_CHECK(A % D == 0, "{}: grad_accum {} is not a multiple of dp={}", cfg_.where, A, D);
  if (lead) fs::create_directories(out_);
  const fs::path metrics = out_ / "metrics.jsonl", events = out_ / "events.jsonl", ckroot = out_ / "checkpoints";

  std::vector<optim::ParamRef> params = model_.params();
  optim::apply_freeze(params, cfg_.freeze);
  // A tensor shared by two stages (the head stage's copy of embed.weight) is optimised on the lower
  // stage only: the higher one sends its gradient down before the reduction and gets the value back after.
  const std::vector<std::string> shared = model_.stage_shared_params();
  std::vector<optim::ParamRef> shared_refs;
  for (const auto& name : shared) {
    auto it = std::find_if(params.begin(), params.end(), [&](const optim::ParamRef& p) { return p.name == name; });
    TREX_CHECK(it != params.end(), "rank {}: stage-shared tensor '{}' is not among the stage's parameters",
               world_.rank(), name);
    TREX_CHECK(mesh_.pp_rank == 0 || mesh_.pp_rank == P - 1,
               "rank {} (pipeline rank {}): stage-shared tensor '{}' on a middle stage is not supported",
               world_.rank(), mesh_.pp_rank, name);
    shared_refs.push_back(*it);
    if (mesh_.pp_rank != 0 && it->trains()) it->group = optim::ParamGroup::Frozen;  // the copy: not optimised here
  }

  RunOptimizer opt;
  for (const auto& p : params)
    if (p.trains()) opt.trained.push_back(p);
  if (world_.size() > 1) {
    opt.zero = std::make_unique<parallel::Zero1Optimizer>(params, cfg_.optimizer, *mesh_.dp_group, *mesh_.edp_group,
                                                          P > 1 ? mesh_.pp_group.get() : nullptr);
    parallel::Zero1Optimizer* z = opt.zero.get();
    model_.set_grads_ready([z, shared](const std::vector<std::string>& names) {
      if (shared.empty()) return z->on_grads_ready(names);
      std::vector<std::string> keep;  // shared tensors wait for their pipeline sum
      for (const auto& n : names)
        if (std::find(shared.begin(), shared.end(), n) == shared.end()) keep.push_back(n);
      z->on_grads_ready(keep);
    });
  } else {
    opt.plain = std::make_unique<optim::Optimizer>(params, cfg_.optimizer);
  }

  data::Sampler sampler(ds_.rows(), cfg_.seed);
  TrainState st;
  st.sampler = sampler.state();
  st.rng = cfg_.seed ^ 0x5DEECE66Dull;
  TrainResult res;
  if (auto last = latest_checkpoint(ckroot)) {
    // Either format, saved by any layout: tensors are found by name (sharded_checkpoint.h).
    st = opt.plain ? load_checkpoint(*last, params, *opt.plain) : load_into_zero1(*last, params, *opt.zero);
    sampler.set_state(st.sampler);
    if (lead) {
      truncate_metrics(metrics, st.step);
      append_jsonl(events, {{"event", "resume"}, {"step", st.step}, {"checkpoint", last->string()}});
    }
    res.resumed = true;
    log::info("resuming from {} (step {})", last->string(), st.step);
  } else if (lead) {
    truncate_metrics(metrics, 0);
  }
  res.start_step = st.step;
  const int64_t stop = opts_.stop_at > 0 ? opts_.stop_at : cfg_.max_steps;
  if (lead)
    log::info("{}: mesh pp={} dp={} ep={} vpp={} ({} schedule, {} micro-batches per DP rank), optimizer {}{}, batch "
              "{} x {} accum",
              model_.describe(), P, D, mesh_.spec.ep, mesh_.spec.vpp, parallel::schedule_kind_name(cfg_.parallel.schedule),
              M, cfg_.optimizer.kind, opt.zero ? " (ZeRO-1)" : "", cfg_.batch_size, A);

  ProgressBar bar("train", stop, "step");
  const double flops_tok = model_.flops_per_token(ds_.seq_len());
  bool first = true;
  std::vector<data::Batch> mbs(static_cast<size_t>(M));
  while (st.step < stop) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = optim::lr_at(cfg_.schedule, st.step);
    model_.set_controls({optim::mtp_weight_at(cfg_.schedule, st.step)});
    model_.zero_grads();
    // Every rank draws the whole step's rows (same sampler state everywhere) and keeps its DP share.
    for (int64_t a = 0; a < A; ++a) {
      std::vector<int64_t> rows = sampler.next_rows(cfg_.batch_size);
      if (a / M == mesh_.dp_rank) data::make_batch(ds_, rows, pad_id_, mbs[size_t(a % M)]);
    }
    st.sampler = sampler.state();
    parallel::PipelineStepStats pipe;
    double local = model_.run_micro_batches(mbs, [&] { opt.begin(model_.grad_scale(M)); }, &pipe);
    // Shared stage tensors: the upper copy's gradient joins the lower one before the DP reduction.
    for (auto& ref : shared_refs) {
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
    const double loss = red[0] / double(D);
    targets = int64_t(red[1]);
    tokens = int64_t(red[2]);

    // The same decisions on every rank: the loss is all-reduced and the norm is global.
    bool spike = is_spike(cfg_.spike, loss, st.recent_losses);
    double grad_norm = NAN;
    if (!spike) {
      grad_norm = opt.clip();
      spike = !std::isfinite(grad_norm);
    }
    bool skipped = false;
    if (spike) {
      res.spikes++;
      json ev = {{"event", "spike"}, {"step", st.step}, {"loss", std::isfinite(loss) ? json(loss) : json("non-finite")},
                 {"action", cfg_.spike.action}};
      if (cfg_.spike.action == "rollback") {
        // Every rank sees the same newest checkpoint (saving is collective and the directory is shared) and
        // makes the same decision, as trainer.cpp does: reload the weights and this rank's optimiser state,
        // keep the sampler past the offending batch.
        if (auto last = latest_checkpoint(ckroot)) {
          TREX_CHECK(st.rollbacks < cfg_.spike.max_rollbacks, "loss spike at step {} after {} rollbacks: giving up",
                     st.step, st.rollbacks);
          const data::SamplerState past = sampler.state();
          const int64_t rollbacks = st.rollbacks + 1;
          st = opt.plain ? load_checkpoint(*last, params, *opt.plain) : load_into_zero1(*last, params, *opt.zero);
          st.sampler = past;
          st.rollbacks = rollbacks;
          res.rollbacks++;
          if (lead) {
            truncate_metrics(metrics, st.step);
            ev["to_step"] = st.step;
            append_jsonl(events, ev);
            log::warn("loss spike ({}) at step {}: rolled back to {}", loss, ev["step"].get<int64_t>(),
                      last->string());
          }
          world_.barrier();  // no rank runs ahead of the others' reload
          continue;
        }
        ev["note"] = "no checkpoint yet: skipped the batch instead";
      }
      skipped = cfg_.spike.action != "none" || !std::isfinite(loss) || !std::isfinite(grad_norm);
      if (lead) {
        append_jsonl(events, ev);
        if (skipped) log::warn("loss spike ({}) at step {}: batch skipped", loss, st.step);
      }
    }
    if (skipped) {
      // Nothing to update; the gradients are zeroed at the next step.
    } else {
      if (!std::isfinite(grad_norm)) grad_norm = opt.clip();
      opt.step(lr);
      for (auto& ref : shared_refs) {  // the updated value back to the upper copy
        const size_t bytes = size_t(ref.numel()) * sizeof(float);
        if (mesh_.pp_rank == 0) mesh_.pp_group->send(ref.value, bytes, P - 1, 30001)->wait();
        else mesh_.pp_group->recv(ref.value, bytes, 0, 30001)->wait();
      }
      if (D > 1) model_.sum_expert_loads(*mesh_.dp_group);
      model_.after_optimizer_step();
      st.recent_losses.push_back(loss);
      if (int64_t(st.recent_losses.size()) > cfg_.spike.window) st.recent_losses.erase(st.recent_losses.begin());
    }
    st.step++;
    st.tokens_seen += tokens;
    // The slowest rank sets the step time.
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double timing[4] = {secs, pipe.bubble_s, pipe.exposed_comm_s, pipe.wait_s};
    world_.all_reduce(timing, 4, comm::ElemType::F64, comm::ReduceOp::Max)->wait();
    secs = timing[0];
    const double tps = secs > 0 ? double(tokens) / secs : 0.0;
    const double tps_gpu = tps / double(world_.size());
    const double mfu = tps_gpu * flops_tok / cfg_.peak_flops;
    if (lead) {
      json m = {{"step", st.step}, {"loss", std::isfinite(loss) ? json(loss) : json(nullptr)}, {"lr", lr},
                {"grad_norm", std::isfinite(grad_norm) ? json(grad_norm) : json(nullptr)}, {"tokens", st.tokens_seen},
                {"tokens_per_s", tps}, {"tokens_per_s_per_rank", tps_gpu}, {"mfu", mfu}, {"targets", targets}};
      if (P > 1) {
        m["pipeline_bubble_s"] = timing[1];
        m["exposed_comm_s"] = timing[2];
        m["pipeline_wait_s"] = timing[3];
        m["bubble_fraction"] = pipe.bubble_fraction;
      }
      if (skipped) m["skipped"] = true;
      append_jsonl(metrics, m);
      if (opts_.show_progress)
        bar.update(st.step, fmt::format("loss {:.4f} lr {:.2e} gnorm {:.3f} tok/s {} MFU {:.3f}%", loss, lr, grad_norm,
                                        human_rate(tps), 100 * mfu));
    }
    if (first) res.first_loss = loss, first = false;
    res.last_loss = loss;
    if (st.step % cfg_.ckpt_every == 0 || st.step == stop) {
      if (opt.plain) {
        save_checkpoint(ckroot, st, params, *opt.plain, cfg_.keep_last);
      } else if (opts_.save_sharded) {
        opts_.save_sharded(ckroot, st);
      } else {
        ShardedSaveArgs sa;
        sa.keep_last = cfg_.keep_last;
        sa.config = cfg_.raw;
        if (mesh_.pp_rank != 0) sa.not_written = shared;  // the lower stage writes the shared tensor
        save_sharded_checkpoint(ckroot, st, params, *opt.zero, mesh_, world_, sa);
      }
    }
  }
  if (lead && opts_.show_progress) bar.finish(fmt::format("loss {:.4f}", res.last_loss));
  res.end_step = st.step;
  if (lead && cfg_.plot) write_loss_plot(metrics, out_, "trex train");
  world_.barrier();
  return res;
}

}  // namespace trex::train
