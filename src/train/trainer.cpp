#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/sampler.h"
#include "optim/param_groups.h"
#include "train/metrics.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

Trainer::Trainer(const TrainConfig& cfg, fs::path out_dir, Trainable& model, const data::ShardDataset& ds,
                 int32_t pad_id, TrainerOptions opts)
    : cfg_(cfg), out_(std::move(out_dir)), model_(model), ds_(ds), pad_id_(pad_id), opts_(std::move(opts)) {}

bool Trainer::is_spike(double loss, const std::vector<double>& h) const {
  if (!std::isfinite(loss)) return true;
  if (int64_t(h.size()) < cfg_.spike.min_history) return false;
  double mean = 0, var = 0;
  for (double x : h) mean += x;
  mean /= double(h.size());
  for (double x : h) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / double(h.size()));
  return loss > mean + cfg_.spike.z_threshold * sd && loss > cfg_.spike.min_ratio * mean;
}

static std::string human_rate(double r) {
  if (r >= 1e6) return fmt::format("{:.2f}M", r / 1e6);
  if (r >= 1e3) return fmt::format("{:.1f}k", r / 1e3);
  return fmt::format("{:.0f}", r);
}

TrainResult Trainer::run() {
  fs::create_directories(out_);
  const fs::path metrics = out_ / "metrics.jsonl", events = out_ / "events.jsonl", ckroot = out_ / "checkpoints";
  std::unique_ptr<ParamUpdater> upd = model_.make_updater(cfg_.optimizer, cfg_.freeze);
  data::Sampler sampler(ds_.rows(), cfg_.seed);
  TrainState st;
  st.sampler = sampler.state();
  st.rng = cfg_.seed ^ 0x5DEECE66Dull;
  TrainResult res;
  if (auto last = latest_checkpoint(ckroot)) {
    st = upd->load(*last);
    sampler.set_state(st.sampler);
    truncate_metrics(metrics, st.step);
    res.resumed = true;
    append_jsonl(events, {{"event", "resume"}, {"step", st.step}, {"checkpoint", last->string()}});
    log::info("resuming from {} (step {})", last->string(), st.step);
  } else {
    truncate_metrics(metrics, 0);
  }
  res.start_step = st.step;
  const int64_t stop = opts_.stop_at > 0 ? opts_.stop_at : cfg_.max_steps;
  const int64_t n_params = upd->n_params(), n_trained = upd->n_trained();
  log::info("{}: {} parameters ({} trained), optimizer {}, {} rows of {} tokens, batch {} x {} accum", model_.describe(),
            n_params, n_trained, cfg_.optimizer.kind, ds_.rows(), ds_.seq_len(), cfg_.batch_size, cfg_.grad_accum);

  ProgressBar bar("train", stop, "step");
  data::Batch batch;
  const double flops_tok = model_.flops_per_token(ds_.seq_len());
  bool first = true;
  while (st.step < stop) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = optim::lr_at(cfg_.schedule, st.step);
    model_.set_controls({optim::mtp_weight_at(cfg_.schedule, st.step)});
    model_.zero_grads();
    double loss = 0;
    int64_t tokens = 0, targets = 0;
    for (int64_t a = 0; a < cfg_.grad_accum; ++a) {
      data::make_batch(ds_, sampler.next_rows(cfg_.batch_size), pad_id_, batch);
      StepStats s = model_.forward_backward(batch);
      loss += s.loss / double(cfg_.grad_accum);
      tokens += batch.batch * batch.seq;
      targets += batch.n_targets;
    }
    if (cfg_.grad_accum > 1) upd->scale_grads(float(1.0 / double(cfg_.grad_accum)));
    st.sampler = sampler.state();
    bool spike = is_spike(loss, st.recent_losses);
    double grad_norm = NAN;
    if (!spike) {
      grad_norm = upd->clip_gradients();
      spike = !std::isfinite(grad_norm);
    }
    bool skipped = false;
    if (spike) {
      res.spikes++;
      json ev = {{"event", "spike"}, {"step", st.step}, {"loss", std::isfinite(loss) ? json(loss) : json("non-finite")},
                 {"action", cfg_.spike.action}};
      if (cfg_.spike.action == "rollback") {
        auto last = latest_checkpoint(ckroot);
        if (last) {
          TREX_CHECK(st.rollbacks < cfg_.spike.max_rollbacks, "loss spike at step {} after {} rollbacks: giving up",
                     st.step, st.rollbacks);
          const data::SamplerState past = sampler.state();  // continue after the offending data
          const int64_t rollbacks = st.rollbacks + 1;
          st = upd->load(*last);
          st.sampler = past;
          st.rollbacks = rollbacks;
          res.rollbacks++;
          truncate_metrics(metrics, st.step);
          ev["to_step"] = st.step;
          append_jsonl(events, ev);
          log::warn("loss spike ({}) at step {}: rolled back to {}", loss, ev["step"].get<int64_t>(), last->string());
          continue;
        }
        ev["note"] = "no checkpoint yet: skipped the batch instead";
      }
      append_jsonl(events, ev);
      if (cfg_.spike.action != "none" || !std::isfinite(loss) || !std::isfinite(grad_norm)) {
        skipped = true;
        log::warn("loss spike ({}) at step {}: batch skipped", loss, st.step);
      }
    }
    if (!skipped) {
      if (!std::isfinite(grad_norm)) grad_norm = upd->clip_gradients();
      upd->step(lr);
      model_.after_optimizer_step();
      st.recent_losses.push_back(loss);
      if (int64_t(st.recent_losses.size()) > cfg_.spike.window) st.recent_losses.erase(st.recent_losses.begin());
    }
    st.step++;
    st.tokens_seen += tokens;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = secs > 0 ? double(tokens) / secs : 0.0;
    const double mfu = tps * flops_tok / cfg_.peak_flops;
    json m = {{"step", st.step}, {"loss", std::isfinite(loss) ? json(loss) : json(nullptr)}, {"lr", lr},
              {"grad_norm", std::isfinite(grad_norm) ? json(grad_norm) : json(nullptr)}, {"tokens", st.tokens_seen},
              {"tokens_per_s", tps}, {"mfu", mfu}, {"targets", targets}};
    if (skipped) m["skipped"] = true;
    append_jsonl(metrics, m);
    if (first) res.first_loss = loss, first = false;
    res.last_loss = loss;
    if (opts_.show_progress)
      bar.update(st.step, fmt::format("loss {:.4f} lr {:.2e} gnorm {:.3f} tok/s {} MFU {:.3f}%", loss, lr, grad_norm,
                                      human_rate(tps), 100 * mfu));
    if (st.step % cfg_.ckpt_every == 0 || st.step == stop)
      upd->save(ckroot, st, cfg_.keep_last, opts_.checkpoint_fault);
  }
  if (opts_.show_progress) bar.finish(fmt::format("loss {:.4f}", res.last_loss));
  res.end_step = st.step;
  if (cfg_.plot) write_loss_plot(metrics, out_, "trex train");
  return res;
}

}  // namespace trex::train
