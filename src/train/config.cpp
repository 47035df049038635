#include "train/config.h"

#include <fmt/format.h>

#include "core/error.h"
#include "train/yaml.h"

namespace trex::train {

using json = nlohmann::json;

namespace {
void only_keys(const json& j, std::initializer_list<const char*> keys, const std::string& where, const char* section) {
  TREX_CHECK(j.is_object(), "{}: '{}' must be a mapping", where, section);
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : keys) ok |= it.key() == k;
    TREX_CHECK(ok, "{}: unknown key '{}' in '{}'", where, it.key(), section);
  }
}
template <class T>
void get(const json& j, const char* key, T& out, const std::string& where, const char* section) {
  if (!j.contains(key) || j[key].is_null()) return;
  try {
    out = j[key].get<T>();
  } catch (const json::exception& e) {
    fail("{}: {}.{}: {}", where, section, key, e.what());
  }
}
}  // namespace

TrainConfig parse_train_config(const json& j, const std::string& where) {
  TrainConfig c;
  c.where = where;
  c.raw = j;
  only_keys(j, {"seed", "device", "model", "data", "optimizer", "schedule", "freeze", "train", "checkpoint", "spike",
             "logging", "parallel", "recompute", "recompute_full_layers"},
            where, "top level");
  get(j, "seed", c.seed, where, "top");
  if (j.contains("recompute")) {
    TREX_CHECK(j["recompute"].is_string(), "{}: recompute must be none, selective or full", where);
    c.recompute = dsv4::parse_recompute(j["recompute"].get<std::string>(), where + ": recompute");
  }
  if (j.contains("recompute_full_layers")) {
    TREX_CHECK(j["recompute_full_layers"].is_number_integer() && j["recompute_full_layers"].get<int64_t>() >= 0,
               "{}: recompute_full_layers must be a layer count >= 0", where);
    TREX_CHECK(c.recompute == dsv4::Recompute::Full,
               "{}: recompute_full_layers goes with recompute: full (got recompute: {})", where,
               dsv4::to_string(c.recompute));
    c.recompute_full_layers = j["recompute_full_layers"].get<int64_t>();
  }
  get(j, "device", c.device, where, "top");
  TREX_CHECK(c.device == "cpu" || c.device == "cuda", "{}: device '{}' (expected cpu or cuda)", where, c.device);
  TREX_CHECK(j.contains("model"), "{}: missing 'model' section", where);
  c.model = j["model"];
  TREX_CHECK(c.model.is_object(), "{}: 'model' must be a mapping", where);
  c.model_type = c.model.value("type", "dsv4");
  TREX_CHECK(c.model_type == "dsv4" || c.model_type == "toy", "{}: model.type '{}' (expected dsv4 or toy)", where,
             c.model_type);
  TREX_CHECK(j.contains("data"), "{}: missing 'data' section", where);
  const json& d = j["data"];
  only_keys(d,
            {"shards", "jsonl", "tokenizer", "format", "skip_bad_lines", "long_chats", "seq_len", "batch_size",
             "grad_accum"},
            where, "data");
  std::string s;
  get(d, "shards", s, where, "data");
  c.shards = s;
  s.clear();
  get(d, "tokenizer", s, where, "data");
  c.tokenizer = s;
  if (d.contains("jsonl")) {
    const json& files = d["jsonl"];
    if (files.is_string()) c.jsonl.push_back(files.get<std::string>());
    else {
      TREX_CHECK(files.is_array(), "{}: data.jsonl must be a path or a list of paths", where);
      for (const auto& f : files) c.jsonl.push_back(f.get<std::string>());
    }
  }
  TREX_CHECK(!c.shards.empty() || !c.jsonl.empty(), "{}: data needs 'shards' or 'jsonl'", where);
  TREX_CHECK(!c.tokenizer.empty(), "{}: data.tokenizer is required (tokenizer.json)", where);
  get(d, "format", c.data_format, where, "data");
  get(d, "skip_bad_lines", c.skip_bad_lines, where, "data");
  std::string long_chats = "truncate";
  get(d, "long_chats", long_chats, where, "data");
  c.long_chats = data::parse_long_chats(long_chats, where + ": data");
  get(d, "seq_len", c.seq_len, where, "data");
  get(d, "batch_size", c.batch_size, where, "data");
  get(d, "grad_accum", c.grad_accum, where, "data");
  TREX_CHECK(c.seq_len >= 2 && c.batch_size >= 1 && c.grad_accum >= 1,
             "{}: need data.seq_len >= 2, batch_size >= 1, grad_accum >= 1", where);
  c.optimizer = optim::parse_optimizer_config(j.value("optimizer", json()), where + ": optimizer");
  c.schedule = optim::parse_schedule_config(j.value("schedule", json()), where);
  if (j.contains("freeze")) {
    TREX_CHECK(j["freeze"].is_array(), "{}: freeze must be a list of name patterns", where);
    for (const auto& f : j["freeze"]) c.freeze.push_back(f.get<std::string>());
  }
  if (j.contains("train")) {
    only_keys(j["train"], {"max_steps", "deterministic", "device_memory_gib"}, where, "train");
    get(j["train"], "max_steps", c.max_steps, where, "train");
    get(j["train"], "deterministic", c.deterministic, where, "train");
    get(j["train"], "device_memory_gib", c.device_memory_gib, where, "train");
    TREX_CHECK(c.device_memory_gib >= 0, "{}: train.device_memory_gib must be >= 0 (0 or absent: the device's free "
               "memory), not {}", where, c.device_memory_gib);
  }
  TREX_CHECK(c.max_steps >= 1, "{}: train.max_steps must be >= 1", where);
  if (c.schedule.total_steps == 0) c.schedule.total_steps = c.max_steps;
  if (j.contains("checkpoint")) {
    only_keys(j["checkpoint"], {"every", "keep_last"}, where, "checkpoint");
    get(j["checkpoint"], "every", c.ckpt_every, where, "checkpoint");
    get(j["checkpoint"], "keep_last", c.keep_last, where, "checkpoint");
  }
  TREX_CHECK(c.ckpt_every >= 1 && c.keep_last >= 1, "{}: checkpoint.every and keep_last must be >= 1", where);
  if (j.contains("spike")) {
    const json& sp = j["spike"];
    only_keys(sp, {"action", "z_threshold", "min_ratio", "window", "min_history", "max_rollbacks"}, where, "spike");
    get(sp, "action", c.spike.action, where, "spike");
    get(sp, "z_threshold", c.spike.z_threshold, where, "spike");
    get(sp, "min_ratio", c.spike.min_ratio, where, "spike");
    get(sp, "window", c.spike.window, where, "spike");
    get(sp, "min_history", c.spike.min_history, where, "spike");
    get(sp, "max_rollbacks", c.spike.max_rollbacks, where, "spike");
    TREX_CHECK(c.spike.action == "skip" || c.spike.action == "rollback" || c.spike.action == "none",
               "{}: spike.action '{}' (expected skip, rollback or none)", where, c.spike.action);
  }
  if (j.contains("parallel")) {
    const json& p = j["parallel"];
    only_keys(p, {"pp", "dp", "ep", "vpp", "tp", "etp", "schedule", "micro_batches", "comm", "timeout_s", "zero",
                  "grad_reduce_dtype", "pad_layers"},
              where, "parallel");
    ParallelConfig& pc = c.parallel;
    pc.present = true;
    get(p, "pp", pc.mesh.pp, where, "parallel");
    get(p, "dp", pc.mesh.dp, where, "parallel");
    get(p, "ep", pc.mesh.ep, where, "parallel");
    get(p, "vpp", pc.mesh.vpp, where, "parallel");
    get(p, "tp", pc.mesh.tp, where, "parallel");
    get(p, "etp", pc.mesh.etp, where, "parallel");
    std::string kind = pc.mesh.vpp > 1 ? "interleaved" : "1f1b";
    get(p, "schedule", kind, where, "parallel");
    try {
      pc.schedule = parallel::parse_schedule_kind(kind);
    } catch (const Error& e) {
      fail("{}: parallel.schedule: {}", where, e.what());
    }
    get(p, "micro_batches", pc.micro_batches, where, "parallel");
    get(p, "pad_layers", pc.pad_layers, where, "parallel");
    TREX_CHECK(pc.pad_layers >= 0, "{}: parallel.pad_layers must be >= 0 (no-op layers), not {}", where,
               pc.pad_layers);
    get(p, "comm", pc.comm, where, "parallel");
    get(p, "timeout_s", pc.timeout_s, where, "parallel");
    TREX_CHECK(pc.mesh.pp >= 1 && pc.mesh.dp >= 1 && pc.mesh.ep >= 1 && pc.mesh.vpp >= 1 && pc.mesh.tp >= 1,
               "{}: parallel.pp, dp, ep, vpp and tp must be >= 1", where);
    TREX_CHECK(pc.micro_batches >= 0, "{}: parallel.micro_batches must be >= 1 (or left out)", where);
    TREX_CHECK(pc.comm == "auto" || pc.comm == "mpi" || pc.comm == "local",
               "{}: parallel.comm '{}' (expected auto, mpi or local)", where, pc.comm);
    TREX_CHECK(pc.timeout_s > 0, "{}: parallel.timeout_s must be > 0", where);
    get(p, "zero", pc.zero, where, "parallel");
    TREX_CHECK(pc.zero >= 1 && pc.zero <= 3,
               "{}: parallel.zero {} (expected 1: sharded optimiser, 2: sharded gradients, 3: fully sharded weights)",
               where, pc.zero);
    get(p, "grad_reduce_dtype", pc.grad_reduce_dtype, where, "parallel");
    TREX_CHECK(pc.grad_reduce_dtype == "fp32" || pc.grad_reduce_dtype == "bf16",
               "{}: parallel.grad_reduce_dtype '{}' (expected fp32 or bf16)", where, pc.grad_reduce_dtype);
    if (pc.micro_batches > 0) {
      const int64_t accum = pc.micro_batches * pc.mesh.dp;
      TREX_CHECK(!(j["data"].contains("grad_accum")) || c.grad_accum == accum,
                 "{}: data.grad_accum {} but parallel.micro_batches {} x dp {} = {} micro-batches per step", where,
                 c.grad_accum, pc.micro_batches, pc.mesh.dp, accum);
      c.grad_accum = accum;
    }
  }
  if (j.contains("logging")) {
    only_keys(j["logging"], {"peak_flops", "plot"}, where, "logging");
    get(j["logging"], "peak_flops", c.peak_flops, where, "logging");
    get(j["logging"], "plot", c.plot, where, "logging");
  }
  return c;
}

std::string check_parallel_config(const TrainConfig& c, int world_size, const parallel::ModelShape& model) {
  const ParallelConfig& p = c.parallel;
  std::string why = parallel::check_mesh(p.mesh, world_size, model);
  if (!why.empty()) return why;
  if (c.grad_accum % p.mesh.dp != 0)
    return fmt::format("data.grad_accum {} micro-batches per step cannot be dealt evenly to dp={} ranks", c.grad_accum,
                       p.mesh.dp);
  parallel::ScheduleSpec s{p.mesh.pp, p.mesh.vpp, c.grad_accum / p.mesh.dp, p.schedule};
  if (p.mesh.vpp > 1 && p.schedule == parallel::ScheduleKind::OneFOneB)
    return fmt::format("vpp={} needs the interleaved schedule (parallel.schedule: interleaved)", p.mesh.vpp);
  why = parallel::check_schedule_spec(s);
  if (!why.empty()) return why;
  return check_pad_layers(p.mesh, model.n_layers, p.pad_layers);
}

std::string check_pad_layers(const parallel::MeshSpec& m, int64_t n_layers, int64_t pad_layers) {
  if (pad_layers == 0 || n_layers <= 0) return {};
  const int64_t stages = int64_t(m.pp) * m.vpp, slots = n_layers + pad_layers;
  if (slots % stages != 0) {
    const int64_t fit = (n_layers + stages - 1) / stages * stages - n_layers;
    return fmt::format("parallel.pad_layers {}: {} layers + {} no-op layers = {} layer slots do not divide into "
                       "pp={} x vpp={} = {} stages (pad_layers {} would give {} slots per stage)",
                       pad_layers, n_layers, pad_layers, slots, m.pp, m.vpp, stages, fit,
                       (n_layers + fit) / stages);
  }
  // The padding fills the last stages' final slots: the last stage must keep a real layer.
  const int64_t per = slots / stages;
  if (n_layers - (stages - 1) * per < 1)
    return fmt::format("parallel.pad_layers {}: {} layer slots per stage leave the last of the pp={} x vpp={} = {} "
                       "stages without a layer of the {} (it would hold {} no-op layers only); use fewer pad_layers",
                       pad_layers, per, m.pp, m.vpp, stages, n_layers, per);
  return {};
}

TrainConfig load_train_config(const std::filesystem::path& path) {
  return parse_train_config(read_config_file(path), path.string());
}

}  // namespace trex::train
