#include "train/run.h"

#include <fmt/format.h>

#include <cstring>

#include "comm/communicator.h"
#include "comm/launch_env.h"
#include "core/error.h"
#include "core/files.h"
#include "ckpt/safetensors.h"
#include "core/log.h"
#include "data/chat.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/dsv4/config.h"
#include "train/dsv4_trainable.h"
#include "train/cuda/gpu_mesh_engine.h"
#include "train/gpu_mesh_config.h"
#include "train/sharded_checkpoint.h"
#include "train/toy_model.h"
#include "train/yaml.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

void load_run_weights(const std::vector<optim::ParamRef>& params, const fs::path& run_dir, const std::string& where,
                      int rank) {
  const std::string who = rank < 0 ? std::string() : fmt::format(" (rank {})", rank);
  auto last = latest_checkpoint(run_dir / "checkpoints");
  TREX_CHECK(last.has_value(), "{}: init_from_run{}: no checkpoint in {}", where, who,
             (run_dir / "checkpoints").string());
  CheckpointReader r(*last);  // a one-process or a sharded checkpoint (sharded_checkpoint.h)
  for (const auto& p : params) {
    try {
      r.read_param(p.name, p.shape, p.value);
    } catch (const Error& e) {
      fail("{}: init_from_run{}: {}", where, who, e.what());
    }
  }
  if (rank <= 0) log::info("initialised from {}", last->string());
}

std::unique_ptr<Trainable> make_model(const TrainConfig& cfg, const data::Tokenizer& tok) {
  const json& m = cfg.model;
  const std::string where = cfg.where + ": model";
  auto allowed = [&](std::initializer_list<const char*> keys) {
    for (auto it = m.begin(); it != m.end(); ++it) {
      bool ok = false;
      for (const char* k : keys) ok |= it.key() == k;
      TREX_CHECK(ok, "{}: unknown key '{}' for model type {}", where, it.key(), cfg.model_type);
    }
  };
  if (cfg.model_type == "toy") {
    allowed({"type", "hidden", "init_std", "init_from_run"});
    auto model = std::make_unique<ToyLM>(tok.vocab_size(), m.value("hidden", int64_t(32)), cfg.seed, m.value("init_std", 0.02));
    if (m.contains("init_from_run")) load_run_weights(model->params(), m["init_from_run"].get<std::string>(), where);
    return model;
  }
  dsv4::ModelConfig mc;
  Dsv4TrainOptions o;
  dsv4_model_setup(cfg, tok, &mc, &o);
  auto model = std::make_unique<Dsv4Trainable>(mc, o, cfg.seed);
  if (m.contains("init_from")) model->load_pretrained(m["init_from"].get<std::string>());
  if (m.contains("init_from_run")) load_run_weights(model->params(), m["init_from_run"].get<std::string>(), where);
  return model;
}

void dsv4_model_setup(const TrainConfig& cfg, const data::Tokenizer& tok, dsv4::ModelConfig* mc_out,
                      Dsv4TrainOptions* opts_out) {
  const json& m = cfg.model;
  const std::string where = cfg.where + ": model";
  for (auto it = m.begin(); it != m.end(); ++it) {
    bool ok = false;
    for (const char* k : {"type", "config", "dsv4", "init_std", "init_from", "bias_update_speed", "balance_alpha",
                          "use_mtp", "init_from_run"})
      ok |= it.key() == k;
    TREX_CHECK(ok, "{}: unknown key '{}' for model type {}", where, it.key(), cfg.model_type);
  }
  dsv4::ModelConfig mc;
  if (m.contains("config")) {
    mc = dsv4::load_model_config(m["config"].get<std::string>());
  } else {
    TREX_CHECK(m.contains("dsv4"), "{}: needs 'config' (a config.json path) or an inline 'dsv4' mapping", where);
    mc = dsv4::parse_model_config(m["dsv4"], where + ".dsv4");
  }
  TREX_CHECK(mc.vocab_size >= tok.vocab_size(), "{}: vocab_size {} is smaller than the tokenizer's {}", where,
             mc.vocab_size, tok.vocab_size());
  Dsv4TrainOptions o;
  o.init_std = m.value("init_std", 0.02);
  o.bias_update_speed = m.value("bias_update_speed", 1e-3);
  o.model.balance_alpha = m.value("balance_alpha", 1e-4);
  o.model.use_mtp = m.value("use_mtp", true);
  o.model.mtp_weight = cfg.schedule.mtp_weight;
  o.deterministic = cfg.deterministic;
  o.recompute = cfg.recompute;
  o.recompute_full_layers = cfg.recompute_full_layers;
  *mc_out = mc;
  *opts_out = o;
}

fs::path prepare_run(const TrainConfig& cfg, const fs::path& config, const fs::path& out_dir, const RunOptions& opts,
                     const data::Tokenizer& tok) {
  fs::create_directories(out_dir);
  const fs::path saved = out_dir / "config.json";
  if (fs::exists(saved)) {
    json prev = read_json_file(saved);
    for (const char* key : {"model", "data", "seed"})
      TREX_CHECK(prev.value(key, json()) == cfg.raw.value(key, json()),
                 "{}: '{}' differs from the run in {} (recorded in {}); use a new --out directory", config.string(),
                 key, out_dir.string(), saved.string());
  }
  write_json_atomic(saved, cfg.raw);

  fs::path shards = cfg.shards;
  if (shards.empty()) {
    shards = out_dir / "data";
    if (!fs::exists(shards / "index.json")) {
      data::PrepareOptions po;
      po.seq_len = cfg.seq_len;
      po.format = cfg.data_format;
      po.skip_bad_lines = cfg.skip_bad_lines;
      po.long_chats = cfg.long_chats;
      po.show_progress = opts.show_progress;
      data::PrepareStats st = data::prepare_shards(tok, cfg.jsonl, shards, po);
      log::info("prepared {} documents into {} rows ({} target tokens)", st.documents, st.rows, st.target_tokens);
    }
  }
  return shards;
}

fs::path prepare_run_on_lead(const TrainConfig& cfg, const fs::path& config, const fs::path& out_dir,
                             const RunOptions& opts, const data::Tokenizer& tok, comm::Communicator& ranks) {
  const bool lead = ranks.rank() == 0;
  fs::path shards = cfg.shards.empty() ? out_dir / "data" : cfg.shards;
  int32_t ok = 1;
  std::string err;
  if (lead) {
    try {
      shards = prepare_run(cfg, config, out_dir, opts, tok);
    } catch (const Error& e) {
      ok = 0;
      err = e.what();
    }
  }
  ranks.broadcast(&ok, sizeof ok, 0)->wait();
  if (!ok) {
    if (lead) throw Error(err);
    fail("rank {}: rank 0 could not prepare the run in {} (its error says why)", ranks.rank(), out_dir.string());
  }
  return shards;
}

void check_dataset(const TrainConfig& cfg, const fs::path& config, const fs::path& shards, const data::ShardDataset& ds,
                   const data::Tokenizer& tok) {
  TREX_CHECK(ds.seq_len() == cfg.seq_len, "{}: shards in {} have seq_len {}, the config says {}", config.string(),
             shards.string(), ds.seq_len(), cfg.seq_len);
  TREX_CHECK(ds.index().value("vocab_size", int64_t(0)) == tok.vocab_size(),
             "{}: shards in {} were made with a tokenizer of {} tokens, this one has {}", config.string(),
             shards.string(), ds.index().value("vocab_size", int64_t(0)), tok.vocab_size());
}

TrainResult run_training(const fs::path& config, const fs::path& out_dir, const RunOptions& opts) {
  TrainConfig cfg = load_train_config(config);
  if (!opts.device.empty()) {
    TREX_CHECK(opts.device == "cpu" || opts.device == "cuda", "--device '{}' (expected cpu or cuda)", opts.device);
    cfg.device = opts.device;
  }
  const bool distributed = comm::detect_launch_env().world_size > 1 || cfg.parallel.present;
  if (cfg.device == "cuda") {
    // Every GPU run goes through the GPU mesh engine (train/cuda/gpu_mesh_engine.h; one GPU is a mesh of one
    // rank), refused before anything is built when the layout is one it does not run.
    const int world = comm::detect_launch_env().world_size;
    const std::string why = check_gpu_mesh_config(cfg, world);
    if (!why.empty() && distributed)
      fail("{}: device cuda with {} (world size {}) is not supported: {}", config.string(),
           cfg.parallel.present ? "a parallel section" : "several processes", world, why);
    TREX_CHECK(why.empty(), "{}: device cuda: {}", config.string(), why);
    return run_gpu_mesh_training(cfg, config, out_dir, opts);
  }
  // The CPU model keeps every activation (its backend does not recompute).
  TREX_CHECK(cfg.device == "cuda" || cfg.recompute == dsv4::Recompute::None,
             "{}: recompute: {} is implemented on the GPU only (device cuda); the CPU model keeps every activation: "
             "use recompute: none with device cpu", config.string(), dsv4::to_string(cfg.recompute));
  // Several processes, or a parallel section: this rank's MeshEngine under the Trainer (distributed_run.cpp).
  if (distributed) return run_distributed_training(cfg, config, out_dir, opts);
  data::Tokenizer tok = data::Tokenizer::load(cfg.tokenizer);
  const fs::path shards = prepare_run(cfg, config, out_dir, opts, tok);
  data::ShardDataset ds(shards);
  check_dataset(cfg, config, shards, ds, tok);
  auto model = make_model(cfg, tok);
  TrainerOptions to;
  to.stop_at = opts.max_steps;
  to.show_progress = opts.show_progress;
  Trainer trainer(cfg, out_dir, *model, ds, data::ChatTokens::from(tok).eos, to);
  return trainer.run();
}

}  // namespace trex::train
