#include "train/run.h"

#include <cstring>

#include "core/error.h"
#include "core/files.h"
#include "ckpt/safetensors.h"
#include "core/log.h"
#include "data/chat.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "model/dsv4/config.h"
#include "train/dsv4_trainable.h"
#include "train/toy_model.h"
#include "train/yaml.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Starts from the weights (and router biases) of another run's newest checkpoint, e.g. SFT after CPT.
static void init_from_run(Trainable& model, const fs::path& run_dir, const std::string& where) {
  auto last = latest_checkpoint(run_dir / "checkpoints");
  TREX_CHECK(last.has_value(), "{}: init_from_run: no checkpoint in {}", where, (run_dir / "checkpoints").string());
  ckpt::SafetensorsReader r(*last / "model.safetensors");
  for (const auto& p : model.params()) {
    TensorView v;
    try {
      v = r.view(p.name);
    } catch (const Error&) {
      fail("{}: init_from_run: {} lacks '{}'", where, last->string(), p.name);
    }
    TREX_CHECK(v.dtype == DType::F32 && v.shape == p.shape, "{}: init_from_run: '{}' is {} in {}, the model needs {}",
               where, p.name, shape_str(v.shape), last->string(), shape_str(p.shape));
    std::memcpy(p.value, v.data, v.nbytes());
  }
  log::info("initialised from {}", last->string());
}

static std::unique_ptr<Trainable> make_model(const TrainConfig& cfg, const data::Tokenizer& tok) {
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
    if (m.contains("init_from_run")) init_from_run(*model, m["init_from_run"].get<std::string>(), where);
    return model;
  }
  allowed({"type", "config", "dsv4", "init_std", "init_from", "bias_update_speed", "balance_alpha", "use_mtp",
           "init_from_run"});
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
  auto model = std::make_unique<Dsv4Trainable>(mc, o, cfg.seed);
  if (m.contains("init_from")) model->load_pretrained(m["init_from"].get<std::string>());
  if (m.contains("init_from_run")) init_from_run(*model, m["init_from_run"].get<std::string>(), where);
  return model;
}

TrainResult run_training(const fs::path& config, const fs::path& out_dir, const RunOptions& opts) {
  TrainConfig cfg = load_train_config(config);
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

  data::Tokenizer tok = data::Tokenizer::load(cfg.tokenizer);
  fs::path shards = cfg.shards;
  if (shards.empty()) {
    shards = out_dir / "data";
    if (!fs::exists(shards / "index.json")) {
      data::PrepareOptions po;
      po.seq_len = cfg.seq_len;
      po.format = cfg.data_format;
      po.skip_bad_lines = cfg.skip_bad_lines;
      po.show_progress = opts.show_progress;
      data::PrepareStats st = data::prepare_shards(tok, cfg.jsonl, shards, po);
      log::info("prepared {} documents into {} rows ({} target tokens)", st.documents, st.rows, st.target_tokens);
    }
  }
  data::ShardDataset ds(shards);
  TREX_CHECK(ds.seq_len() == cfg.seq_len, "{}: shards in {} have seq_len {}, the config says {}", config.string(),
             shards.string(), ds.seq_len(), cfg.seq_len);
  TREX_CHECK(ds.index().value("vocab_size", int64_t(0)) == tok.vocab_size(),
             "{}: shards in {} were made with a tokenizer of {} tokens, this one has {}", config.string(),
             shards.string(), ds.index().value("vocab_size", int64_t(0)), tok.vocab_size());
  auto model = make_model(cfg, tok);
  TrainerOptions to;
  to.stop_at = opts.max_steps;
  to.show_progress = opts.show_progress;
  Trainer trainer(cfg, out_dir, *model, ds, data::ChatTokens::from(tok).eos, to);
  return trainer.run();
}

}  // namespace trex::train
