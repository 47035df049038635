#include "train/state_checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <regex>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "train/sharded_checkpoint.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

json TrainState::to_json() const {
  return {{"step", step}, {"sampler", sampler.to_json()}, {"rng", rng}, {"tokens_seen", tokens_seen},
          {"rollbacks", rollbacks}, {"recent_losses", recent_losses}};
}

TrainState TrainState::from_json(const json& j, const std::string& where) {
  try {
    TrainState s;
    s.step = j.at("step").get<int64_t>();
    s.sampler = data::SamplerState::from_json(j.at("sampler"));
    s.rng = j.at("rng").get<uint64_t>();
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    s.rollbacks = j.value("rollbacks", int64_t(0));
    s.recent_losses = j.at("recent_losses").get<std::vector<double>>();
    return s;
  } catch (const json::exception& e) {
    fail("{}: bad training state: {}", where, e.what());
  }
}

static std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::exists(root)) return out;
  static const std::regex re("step_([0-9]{8})");
  for (const auto& e : fs::directory_iterator(root)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, re) &&
        (fs::exists(e.path() / "state.json") || fs::exists(e.path() / "manifest.json")))
      out.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  auto all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

fs::path save_checkpoint(const fs::path& root, const TrainState& st, const std::vector<optim::ParamRef>& params,
                         optim::Optimizer& opt, int64_t keep_last, const FaultHook& fault) {
  std::vector<ckpt::TensorToWrite> tensors, ot;
  json groups = json::object();
  for (const auto& p : params) {
    tensors.push_back({p.name, DType::F32, p.shape, p.value, nullptr});
    groups[p.name] = std::string(optim::group_name(p.group));
  }
  for (const auto& s : opt.state_tensors()) ot.push_back({s.name, DType::F32, s.shape, s.data, nullptr});
  return save_checkpoint_tensors(root, st, tensors, ot, opt.steps_done(), groups, keep_last, fault);
}

fs::path save_checkpoint_tensors(const fs::path& root, const TrainState& st,
                                 const std::vector<ckpt::TensorToWrite>& model,
                                 const std::vector<ckpt::TensorToWrite>& optimizer, int64_t optimizer_steps,
                                 const json& param_groups, int64_t keep_last, const FaultHook& fault) {
  fs::create_directories(root);
  const fs::path final_dir = root / step_dir_name(st.step);
  const fs::path tmp = root / fmt::format(".tmp-{}-{}", step_dir_name(st.step), ::getpid());
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    if (fault) fault("model");
    json meta = {{"format", "pt"}, {"producer", "trex train"}};
    ckpt::write_safetensors(tmp / "model.safetensors", model, meta);
    if (fault) fault("optimizer");
    ckpt::write_safetensors(tmp / "optimizer.safetensors", optimizer, meta);
    if (fault) fault("state");
    json state = st.to_json();
    state["optimizer_steps"] = optimizer_steps;
    state["param_groups"] = param_groups;
    write_json_atomic(tmp / "state.json", state);
    fsync_dir(tmp);
    if (fault) fault("rename");
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step (after a rollback)
    fs::rename(tmp, final_dir);
    fsync_dir(root);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  // Prune: keep the newest keep_last complete checkpoints; stale temporaries of dead writers go too.
  auto all = list_checkpoints(root);
  for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i) fs::remove_all(all[i].second);
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 && name != tmp.filename().string()) {
      std::error_code ec;
      fs::remove_all(e.path(), ec);
    }
  }
  return final_dir;
}

static void load_into(const ckpt::SafetensorsReader& r, const std::string& name, const Shape& shape, float* dst,
                      const fs::path& file) {
  TensorView v;
  try {
    v = r.view(name);
  } catch (const Error&) {
    fail("{}: checkpoint lacks tensor '{}'", file.string(), name);
  }
  TREX_CHECK(v.dtype == DType::F32 && v.shape == shape, "{}: tensor '{}' is {} {}, expected F32 {}", file.string(),
             name, dtype_name(v.dtype), shape_str(v.shape), shape_str(shape));
  std::memcpy(dst, v.data, v.nbytes());
}

TrainState load_checkpoint(const fs::path& dir, const std::vector<optim::ParamRef>& params, optim::Optimizer& opt) {
  if (fs::exists(dir / "manifest.json")) return load_into_optimizer(dir, params, opt);  // a sharded checkpoint
  const json state = read_json_file(dir / "state.json");
  TrainState st = TrainState::from_json(state, (dir / "state.json").string());
  {
    ckpt::SafetensorsReader r(dir / "model.safetensors");
    for (const auto& p : params) load_into(r, p.name, p.shape, p.value, dir / "model.safetensors");
  }
  {
    ckpt::SafetensorsReader r(dir / "optimizer.safetensors");
    for (const auto& s : opt.state_tensors()) load_into(r, s.name, s.shape, s.data, dir / "optimizer.safetensors");
  }
  opt.set_steps_done(state.at("optimizer_steps").get<int64_t>());
  return st;
}

}  // namespace trex::train
