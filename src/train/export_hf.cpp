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

ExportResult export_hf(const fs::path& run_dir, const fs::path& out_dir, DType dtype, dsv4::Dialect dialect) {
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
  // Streamed tensor by tensor from the (one-process or sharded, any layout) checkpoint into the HF shards: no
  // process holds the model. The hash-routing tables are not in a training checkpoint: the run's own seeded
  // tables (drawn as the model's init draws them, without allocating it) or those of model.init_from.
  Dsv4TrainOptions o;
  dsv4::ParamTable<float> tables;
  for (const dsv4::ParamSpec& e : dsv4::param_table(mc))
    if (e.kind == dsv4::ParamKind::HashTable) tables.tid2eid[e.name].assign(size_t(numel(e.shape)), 0);
  if (m.contains("init_from")) {
    const dsv4::CheckpointReader pre(m["init_from"].get<std::string>());
    for (auto& [name, table] : tables.tid2eid) {
      const HostTensor t = pre.load(name);
      TREX_CHECK(t.view.dtype == DType::I64 && size_t(t.numel()) == table.size(),
                 "{}: hash table '{}' of init_from has {} {} values, expected {} I64", cfg_path.string(), name,
                 t.numel(), dtype_name(t.view.dtype), table.size());
      for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(t.view.as<int64_t>()[i]);
    }
  } else {
    init_dsv4_weights(tables, mc, o.model, o.init_std, cfg.seed);  // same seed: the tables the run trained with
  }
  const CheckpointReader r(*last);
  const dsv4::TensorFeed feed = [&](const std::string& name, const Shape& shape, DType dt, void* dst) {
    if (dt == DType::I64) {
      const std::vector<int32_t>& t = tables.tid2eid.at(name);
      for (size_t i = 0; i < t.size(); ++i) static_cast<int64_t*>(dst)[i] = t[i];
      return;
    }
    r.read_param(name, shape, static_cast<float*>(dst));
  };
  ExportResult res;
  res.checkpoint = *last;
  res.stats = dsv4::save_model_streaming(out_dir, mc, feed, dialect, dtype);
  return res;
}

}  // namespace trex::train
