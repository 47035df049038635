// trex train CONFIG --out DIR [--max-steps N] [--device cpu|cuda]: CPT/SFT training; re-running with the same DIR
// resumes (also on the other device: the checkpoint format is the same).
// Under mpirun / srun (or with a `parallel:` section) it runs the distributed trainer; rank 0 prints the result.
// trex export-hf RUN --out DIR: a run's newest checkpoint as a Hugging Face model directory.
#include <fmt/format.h>

#include "command.h"
#include "comm/launch_env.h"
#include "core/error.h"
#include "train/export_hf.h"
#include "train/run.h"

namespace {

struct TrainArgs {
  std::string config, out;
  int64_t max_steps = -1;
  bool no_progress = false;
  std::string device;
};

void setup(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  app.add_option("config", a->config, "run config (YAML subset or JSON)")->required();
  app.add_option("--out", a->out, "output directory (checkpoints, metrics.jsonl, loss plot); reused to resume")
      ->required();
  app.add_option("--max-steps", a->max_steps, "stop after this many total steps (default: the config's)");
  app.add_flag("--no-progress", a->no_progress, "no progress bar");
  app.add_option("--device", a->device, "cpu | cuda (one GPU; default: the config's `device`, else cpu)");
  app.callback([a] {
    trex::train::RunOptions o;
    o.max_steps = a->max_steps;
    o.device = a->device;
    o.show_progress = !a->no_progress;
    auto r = trex::train::run_training(a->config, a->out, o);
    if (trex::comm::detect_launch_env().rank != 0) return;  // one result line per job, from rank 0
    fmt::print("{{\"start_step\": {}, \"end_step\": {}, \"resumed\": {}, \"first_loss\": {:.6f}, \"last_loss\": {:.6f}, "
               "\"spikes\": {}, \"rollbacks\": {}, \"out\": \"{}\"}}\n",
               r.start_step, r.end_step, r.resumed, r.first_loss, r.last_loss, r.spikes, r.rollbacks, a->out);
  });
}

const bool registered = trex::cli::register_command({"train", "train a model (CPT / SFT) from a config; resumes in --out", setup});

}  // namespace

// trex export-hf RUN --out DIR: the run's newest checkpoint as a Hugging Face model directory.

namespace {

void setup_export(CLI::App& app) {
  struct Args {
    std::string run, out, dtype = "bf16", dialect = "transformers";
  };
  auto a = std::make_shared<Args>();
  app.add_option("run", a->run, "a `trex train` output directory")->required();
  app.add_option("--out", a->out, "Hugging Face model directory to write")->required();
  app.add_option("--dtype", a->dtype, "bf16 | f32")->capture_default_str();
  app.add_option("--dialect", a->dialect, "transformers | official (tensor naming)")->capture_default_str();
  app.callback([a] {
    TREX_CHECK(a->dtype == "bf16" || a->dtype == "f32", "--dtype '{}' (expected bf16 or f32)", a->dtype);
    TREX_CHECK(a->dialect == "transformers" || a->dialect == "official", "--dialect '{}'", a->dialect);
    auto from = trex::train::export_hf(a->run, a->out, a->dtype == "bf16" ? trex::DType::BF16 : trex::DType::F32,
                                       a->dialect == "official" ? trex::dsv4::Dialect::Official
                                                                : trex::dsv4::Dialect::Transformers);
    // One JSON line: what was exported, and the host memory the streamed export held (one output tensor's buffer
    // plus one fp32 tensor, measured), so a large export's bound is visible.
    fmt::print("{{\"checkpoint\": \"{}\", \"out\": \"{}\", \"tensors\": {}, \"bytes\": {}, \"host_peak_bytes\": {}, "
               "\"seconds\": {:.3f}}}\n",
               from.checkpoint.string(), a->out, from.stats.tensors, from.stats.bytes, from.stats.host_peak_bytes,
               from.stats.seconds);
  });
}

const bool registered_export =
    trex::cli::register_command({"export-hf", "write a training run's newest checkpoint as a Hugging Face model", setup_export});

}  // namespace
