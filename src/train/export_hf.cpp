#include "train/export_hf.h"

#include <cstring>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/checkpoint.h"
#include "train/config.h"
#include "train/dsv4_trainable.h"
#include "train/sharded_checkpoint.h"
#include "train/state_checkpoint.h"

namespace trex::train {

namespace fs = std::filesystem;

fs::path export_hf(const fs::path& run_dir, const fs::path& out_dir, DType dtype, dsv4::Dialect dialect) {
  const fs::path cfg_path = run_dir / "config.json";
  TREX_CHECK(fs::exists(cfg_path), "{}: not a trex train output directory (no config.json)", run_dir.string());
  TrainConfig cfg = parse_train_config(read_json_file(cfg_path), cfg_path.string());
  TREX_CHECK(cfg.model_type == "dsv4", "{}: model type '{}' cannot be exported as a DeepSeek-V4 checkpoint",
             cfg_path.string(), cfg.model_type);
  auto last = latest_checkpoint(run_dir / "checkpoints");
  TREX_CHECK(last.has_value(), "{}: no checkpoint to export", run_dir.string());
  const nlohmann::json& m = cfg.model;
  dsv4::ModelConfig mc = m.contains("config") ? dsv4::load_model_config(m["config"].get<std::string>())
                                              : dsv4::parse_model_config(m.at("dsv4"), cfg_path.string());
  Dsv4TrainOptions o;
  Dsv4Trainable model(mc, o, cfg.seed);  // same seed: the same tid2eid table the run trained with
  if (m.contains("init_from")) model.load_pretrained(m["init_from"].get<std::string>());
  CheckpointReader r(*last);  // a one-process checkpoint, or a sharded one of any layout
  dsv4::StateDict sd;
  for (const auto& p : model.params()) {
    HostTensor t(DType::F32, p.shape);
    r.read_param(p.name, p.shape, t.view.as<float>());
    sd.emplace(p.name, std::move(t));
  }
  for (auto& [name, table] : model.model().params().tid2eid) {
    HostTensor t(DType::I64, {mc.vocab_size, mc.topk});
    for (size_t i = 0; i < table.size(); ++i) t.view.as<int64_t>()[i] = table[i];
    sd.emplace(name, std::move(t));
  }
  dsv4::save_state_dict(out_dir, sd, mc, dialect, dtype);
  return *last;
}

}  // namespace trex::train
