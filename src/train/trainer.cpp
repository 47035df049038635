#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/sampler.h"
#include "optim/param_groups.h"
#include "train/local_engine.h"
#include "train/metrics.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

Trainer::Trainer(const TrainConfig& cfg, fs::path out_dir, StepEngine& engine, const data::ShardDataset& ds,
                 int32_t pad_id, TrainerOptions opts)
    : cfg_(cfg), out_(std::move(out_dir)), engine_(&engine), ds_(ds), pad_id_(pad_id), opts_(std::move(opts)) {}

Trainer::Trainer(const TrainConfig& cfg, fs::path out_dir, Trainable& model, const data::ShardDataset& ds,
                 int32_t pad_id, TrainerOptions opts)
    : cfg_(cfg), out_(std::move(out_dir)), model_(&model), ds_(ds), pad_id_(pad_id), opts_(std::move(opts)) {}

Trainer::~Trainer() = default;

bool is_loss_spike(const SpikeConfig& sc, double loss, const std::vector<double>& h) {
  if (!std::isfinite(loss)) return true;
  if (int64_t(h.size()) < sc.min_history) return false;
  double mean = 0, var = 0;
  for (double x : h) mean += x;
  mean /= double(h.size());
  for (double x : h) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / double(h.size()));
  return loss > mean + sc.z_threshold * sd && loss > sc.min_ratio * mean;
}

static std::string human_rate(double r) {
  if (r >= 1e6) return fmt::format("{:.2f}M", r / 1e6);
  if (r >= 1e3) return fmt::format("{:.1f}k", r / 1e3);
  return fmt::format("{:.0f}", r);
}

TrainResult Trainer::run() {
  if (!engine_) {
    own_ = std::make_unique<LocalEngine>(*model_, cfg_.optimizer, cfg_.freeze);
    engine_ = own_.get();
  }
  StepEngine& eng = *engine_;
  const bool lead = eng.lead();
  if (lead) fs::create_directories(out_);
  const fs::path metrics = out_ / "metrics.jsonl", events = out_ / "events.jsonl", ckroot = out_ / "checkpoints";
  data::Sampler sampler(ds_.rows(), cfg_.seed);
  TrainState st;
  st.sampler = sampler.state();
  st.rng = cfg_.seed ^ 0x5DEECE66Dull;
  TrainResult res;
  if (auto last = latest_checkpoint(ckroot)) {
    st = eng.load(*last);  // either format, saved by any layout: tensors are found by name
    sampler.set_state(st.sampler);
    if (lead) {
      truncate_metrics(metrics, st.step);
      append_jsonl(events, {{"event", "resume"}, {"step", st.step}, {"checkpoint", last->string()}});
      log::info("resuming from {} (step {})", last->string(), st.step);
    }
    res.resumed = true;
  } else if (lead) {
    truncate_metrics(metrics, 0);
  }
  res.start_step = st.step;
  const int64_t stop = opts_.stop_at > 0 ? opts_.stop_at : cfg_.max_steps;
  const int64_t A = cfg_.grad_accum;
  if (lead)
    log::info("{}: {} parameters ({} trained), optimizer {}, {} rows of {} tokens, batch {} x {} accum",
              eng.describe(), eng.n_params(), eng.n_trained(), cfg_.optimizer.kind, ds_.rows(), ds_.seq_len(),
              cfg_.batch_size, A);

  std::optional<ProgressBar> bar;
  if (lead && opts_.show_progress) bar.emplace("train", stop, "step");
  const double flops_tok = eng.flops_per_token(ds_.seq_len());
  bool first = true;
  std::vector<data::Batch> mine;
  while (st.step < stop) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = optim::lr_at(cfg_.schedule, st.step);
    eng.begin_step({optim::mtp_weight_at(cfg_.schedule, st.step)});
    // Every rank draws the whole step's rows (the same sampler state everywhere) and builds its share.
    size_t n_mine = 0;
    for (int64_t a = 0; a < A; ++a) {
      std::vector<int64_t> rows = sampler.next_rows(cfg_.batch_size);
      if (!eng.runs_micro_batch(a, A)) continue;
      if (mine.size() <= n_mine) mine.emplace_back();
      data::make_batch(ds_, rows, pad_id_, mine[n_mine++]);
    }
    mine.resize(n_mine);
    st.sampler = sampler.state();
    const EngineStep es = eng.forward_backward(mine, A);
    const double loss = es.loss;

    // The same decisions on every rank: the loss is the global batch's and the norm is global.
    bool spike = is_loss_spike(cfg_.spike, loss, st.recent_losses);
    double grad_norm = NAN;
    if (!spike) {
      grad_norm = eng.clip_gradients();
      spike = !std::isfinite(grad_norm);
    }
    bool skipped = false;
    if (spike) {
      res.spikes++;
      json ev = {{"event", "spike"}, {"step", st.step}, {"loss", std::isfinite(loss) ? json(loss) : json("non-finite")},
                 {"action", cfg_.spike.action}};
      if (cfg_.spike.action == "rollback") {
        // Every rank sees the same newest checkpoint (saving is collective, the directory shared): reload the
        // weights and this rank's optimiser state, keep the sampler past the offending batch.
        if (auto last = latest_checkpoint(ckroot)) {
          TREX_CHECK(st.rollbacks < cfg_.spike.max_rollbacks, "loss spike at step {} after {} rollbacks: giving up",
                     st.step, st.rollbacks);
          const data::SamplerState past = sampler.state();
          const int64_t rollbacks = st.rollbacks + 1;
          st = eng.load(*last);
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
          eng.barrier();  // no rank runs ahead of the others' reload
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
    if (!skipped) {  // a skipped batch updates nothing; its gradients are zeroed by the next begin_step
      if (!std::isfinite(grad_norm)) grad_norm = eng.clip_gradients();
      eng.optimizer_step(lr);
      st.recent_losses.push_back(loss);
      if (int64_t(st.recent_losses.size()) > cfg_.spike.window) st.recent_losses.erase(st.recent_losses.begin());
    }
    st.step++;
    st.tokens_seen += es.tokens;
    // The slowest rank sets the step time.
    std::vector<double> slow = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
    for (const auto& s : es.slowest) slow.push_back(s.second);
    eng.max_over_ranks(slow.data(), int(slow.size()));
    const double secs = slow[0];
    const double tps = secs > 0 ? double(es.tokens) / secs : 0.0;
    const double tps_rank = tps / double(eng.ranks());
    const double mfu = tps_rank * flops_tok / cfg_.peak_flops;
    if (lead) {
      json m = {{"step", st.step}, {"loss", std::isfinite(loss) ? json(loss) : json(nullptr)}, {"lr", lr},
                {"grad_norm", std::isfinite(grad_norm) ? json(grad_norm) : json(nullptr)}, {"tokens", st.tokens_seen},
                {"tokens_per_s", tps}, {"mfu", mfu}, {"targets", es.targets}};
      if (eng.ranks() > 1) m["tokens_per_s_per_rank"] = tps_rank;
      for (size_t i = 0; i < es.slowest.size(); ++i) m[es.slowest[i].first] = slow[i + 1];
      for (const auto& [k, v] : es.extra) m[k] = v;
      if (skipped) m["skipped"] = true;
      append_jsonl(metrics, m);
      if (bar)
        bar->update(st.step, fmt::format("loss {:.4f} lr {:.2e} gnorm {:.3f} tok/s {} MFU {:.3f}%", loss, lr, grad_norm,
                                         human_rate(tps), 100 * mfu));
    }
    if (first) res.first_loss = loss, first = false;
    res.last_loss = loss;
    if (st.step % cfg_.ckpt_every == 0 || st.step == stop) eng.save(ckroot, st, cfg_.keep_last, opts_.checkpoint_fault);
  }
  if (bar) bar->finish(fmt::format("loss {:.4f}", res.last_loss));
  res.end_step = st.step;
  if (lead && cfg_.plot) write_loss_plot(metrics, out_, "trex train");
  eng.barrier();
  return res;
}

}  // namespace trex::train
