#include "train/sharded_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>

#include "core/error.h"
#include "core/files.h"

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "trex-sharded-checkpoint-1";

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string hex64(uint64_t x) { return fmt::format("{:016x}", x); }

// Runs this rank's part of a save phase, then every rank learns whether all parts succeeded: a failure
// anywhere makes every rank throw (the failing one with its own error), so no rank goes on to a phase whose
// inputs are incomplete.
void agree(comm::Communicator& world, const char* phase, int64_t step, const std::function<void()>& part) {
  std::exception_ptr err;
  try {
    part();
  } catch (...) {
    err = std::current_exception();
  }
  int32_t failed = err ? 1 : 0;
  world.all_reduce(&failed, 1, comm::ElemType::I32, comm::ReduceOp::Sum)->wait();
  if (err) std::rethrow_exception(err);
  if (failed > 0)
    fail("rank {}: sharded checkpoint of step {}: {} rank(s) failed while writing ({}); nothing was renamed into "
         "place (their errors say why)", world.rank(), step, failed, phase);
}

json tensor_record(const std::string& file, const Shape& shape, const void* data, size_t bytes) {
  return {{"file", file}, {"dtype", "F32"}, {"shape", shape}, {"bytes", bytes},
          {"checksum", hex64(tensor_checksum(data, bytes))}};
}

}  // namespace

uint64_t tensor_checksum(const void* data, size_t bytes) {
  // FNV-1a, 8 bytes at a time (then the tail byte-wise): one multiply per word keeps it near memory speed.
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  const uint64_t prime = 0x100000001b3ull;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * prime;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * prime;
  return h;
}

// ---- reading ----

CheckpointReader::CheckpointReader(const fs::path& dir) : dir_(dir) {
  if (fs::exists(dir / "manifest.json")) {
    sharded_ = true;
    manifest_ = read_json_file(dir / "manifest.json");
    const std::string where = (dir / "manifest.json").string();
    try {
      TREX_CHECK(manifest_.at("format").get<std::string>() == kFormat, "{}: format '{}', expected '{}'", where,
                 manifest_.at("format").dump(), kFormat);
      state_ = TrainState::from_json(manifest_.at("state"), where);
      optimizer_steps_ = manifest_.at("optimizer_steps").get<int64_t>();
      std::map<std::string, size_t> file_index;
      for (const auto& f : manifest_.at("files")) {
        file_index[f.get<std::string>()] = file_paths_.size();
        file_paths_.push_back(dir / f.get<std::string>());
      }
      for (auto [table, key] : {std::pair{&params_, "params"}, std::pair{&optim_, "optim"}}) {
        for (const auto& [name, rec] : manifest_.at("tensors").at(key).items()) {
          const std::string fname = rec.at("file").get<std::string>();
          auto it = file_index.find(fname);
          TREX_CHECK(it != file_index.end(), "{}: tensor '{}' names file '{}', which is not among the manifest's files",
                     where, name, fname);
          Loc l{it->second, fname, 0, true};
          l.checksum = std::stoull(rec.at("checksum").get<std::string>(), nullptr, 16);
          table->emplace(name, l);
        }
      }
    } catch (const json::exception& e) {
      fail("{}: bad manifest: {}", where, e.what());
    }
  } else if (fs::exists(dir / "state.json")) {
    const json state = read_json_file(dir / "state.json");
    state_ = TrainState::from_json(state, (dir / "state.json").string());
    optimizer_steps_ = state.at("optimizer_steps").get<int64_t>();
    file_paths_ = {dir / "model.safetensors", dir / "optimizer.safetensors"};
    files_.resize(2);
    for (size_t f = 0; f < 2; ++f) {
      files_[f] = std::make_unique<ckpt::SafetensorsFile>(file_paths_[f]);
      for (const auto& e : files_[f]->entries())
        (f == 0 ? params_ : optim_).emplace(e.name, Loc{f, file_paths_[f].filename().string(), 0, false});
    }
  } else {
    fail("{}: not a checkpoint (neither manifest.json nor state.json)", dir.string());
  }
  files_.resize(file_paths_.size());
}

std::vector<std::string> CheckpointReader::param_names() const {
  std::vector<std::string> v;
  for (const auto& [n, l] : params_) v.push_back(n);
  return v;
}

std::vector<std::string> CheckpointReader::optim_names() const {
  std::vector<std::string> v;
  for (const auto& [n, l] : optim_) v.push_back(n);
  return v;
}

const ckpt::SafetensorsFile& CheckpointReader::file(const Loc& l) const {
  if (!files_[l.file]) files_[l.file] = std::make_unique<ckpt::SafetensorsFile>(file_paths_[l.file]);
  return *files_[l.file];
}

Shape CheckpointReader::param_shape(const std::string& name) const {
  auto it = params_.find(name);
  TREX_CHECK(it != params_.end(), "{}: checkpoint lacks parameter '{}'", dir_.string(), name);
  const ckpt::TensorEntry* e = file(it->second).find(name);
  TREX_CHECK(e != nullptr, "{}: parameter '{}' is not in {}", dir_.string(), name, it->second.file_name);
  return e->shape;
}

Shape CheckpointReader::optim_shape(const std::string& name) const {
  auto it = optim_.find(name);
  TREX_CHECK(it != optim_.end(), "{}: checkpoint lacks optimiser state '{}'", dir_.string(), name);
  const ckpt::TensorEntry* e = file(it->second).find(name);
  TREX_CHECK(e != nullptr, "{}: optimiser state '{}' is not in {}", dir_.string(), name, it->second.file_name);
  return e->shape;
}

void CheckpointReader::read(const std::map<std::string, Loc>& table, const char* kind, const std::string& name,
                            const Shape& shape, float* dst) const {
  auto it = table.find(name);
  if (it == table.end())
    fail("{}: checkpoint lacks {} '{}' (looked in {}){}", dir_.string(), kind, name,
         sharded_ ? "manifest.json" : (std::string(kind) == "parameter" ? "model.safetensors" : "optimizer.safetensors"),
         sharded_ ? fmt::format(", saved with layout {}", manifest_.at("layout").dump()) : "");
  const Loc& l = it->second;
  const ckpt::SafetensorsFile* f = nullptr;
  try {
    f = &file(l);
  } catch (const Error& e) {
    fail("{}: {} '{}' is in file {}, which cannot be read: {}", dir_.string(), kind, name, l.file_name, e.what());
  }
  const ckpt::TensorEntry* e = f->find(name);
  TREX_CHECK(e != nullptr, "{}: {} '{}' is missing from {} (the manifest lists it there)", dir_.string(), kind, name,
             l.file_name);
  TREX_CHECK(e->dtype == DType::F32 && e->shape == shape, "{}: {} '{}' in {} is {} {}, expected F32 {}", dir_.string(),
             kind, name, l.file_name, dtype_name(e->dtype), shape_str(e->shape), shape_str(shape));
  TensorView v = f->view(*e);
  if (l.has_checksum) {
    const uint64_t got = tensor_checksum(v.data, v.nbytes());
    TREX_CHECK(got == l.checksum, "{}: {} '{}' in {} has checksum {}, the manifest says {} (corrupt file?)",
               dir_.string(), kind, name, l.file_name, hex64(got), hex64(l.checksum));
  }
  std::memcpy(dst, v.data, v.nbytes());
}

void CheckpointReader::read_param(const std::string& name, const Shape& shape, float* dst) const {
  read(params_, "parameter", name, shape, dst);
}

void CheckpointReader::read_optim(const std::string& name, const Shape& shape, float* dst) const {
  read(optim_, "optimiser state", name, shape, dst);
}

TrainState load_into_zero1(const fs::path& dir, const std::vector<optim::ParamRef>& params,
                           parallel::Zero1Optimizer& zero) {
  CheckpointReader r(dir);
  for (const auto& p : params) r.read_param(p.name, p.shape, p.value);
  for (const auto& s : zero.state_tensors()) r.read_optim(s.name, s.shape, s.data);
  zero.set_steps_done(r.optimizer_steps());
  return r.state();
}

TrainState load_into_optimizer(const fs::path& dir, const std::vector<optim::ParamRef>& params, optim::Optimizer& opt) {
  CheckpointReader r(dir);
  for (const auto& p : params) r.read_param(p.name, p.shape, p.value);
  for (const auto& s : opt.state_tensors()) r.read_optim(s.name, s.shape, s.data);
  opt.set_steps_done(r.optimizer_steps());
  return r.state();
}

// ---- writing ----

fs::path save_sharded_checkpoint(const fs::path& root, const TrainState& st, const std::vector<optim::ParamRef>& params,
                                 parallel::Zero1Optimizer& zero, const parallel::Mesh& mesh, comm::Communicator& world,
                                 const ShardedSaveArgs& args) {
  const std::set<std::string> skip(args.not_written.begin(), args.not_written.end());
  std::vector<ShardedTensor> pt, ot;
  for (const auto& p : params) {
    if (skip.count(p.name)) continue;
    const int owner = zero.owner_of(p.name);
    const bool writes = owner >= 0 ? zero.owns(p.name)
                                   : (parallel::is_expert_param(p.name) ? mesh.edp_rank == 0 : mesh.dp_rank == 0);
    if (writes) pt.push_back({p.name, p.shape, p.value, std::string(optim::group_name(p.group))});
  }
  for (const auto& s : zero.state_tensors()) ot.push_back({s.name, s.shape, s.data, ""});
  return save_sharded_tensors(root, st, pt, ot, zero.steps_done(), mesh, world, args);
}

fs::path save_sharded_tensors(const fs::path& root, const TrainState& st, const std::vector<ShardedTensor>& params,
                              const std::vector<ShardedTensor>& optim, int64_t optimizer_steps,
                              const parallel::Mesh& mesh, comm::Communicator& world, const ShardedSaveArgs& args) {
  const int R = world.rank(), W = world.size();
  const fs::path final_dir = root / step_dir_name(st.step);
  const fs::path tmp = root / (".tmp-" + step_dir_name(st.step));
  const auto fault = [&](std::string_view stage) {
    if (args.fault) args.fault(stage);
  };

  agree(world, "preparing the directory", st.step, [&] {
    if (R != 0) return;
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  });

  agree(world, "rank files", st.step, [&] {
    const std::string pfile = fmt::format("rank-{}.safetensors", R), ofile = fmt::format("rank-{}.optim.safetensors", R);
    json index = {{"rank", R}, {"pp_rank", mesh.pp_rank}, {"dp_rank", mesh.dp_rank}, {"ep_rank", mesh.ep_rank},
                  {"tp_rank", mesh.tp_rank}, {"params", json::object()}, {"optim", json::object()}};
    std::vector<ckpt::TensorToWrite> pt;
    for (const auto& p : params) {
      const size_t bytes = size_t(numel(p.shape)) * sizeof(float);
      pt.push_back({p.name, DType::F32, p.shape, p.data, nullptr});
      json rec = tensor_record(pfile, p.shape, p.data, bytes);
      rec["group"] = p.group;
      index["params"][p.name] = rec;
    }
    const json meta = {{"format", "pt"}, {"producer", "trex train (sharded)"}};
    fault("params");
    ckpt::write_safetensors(tmp / pfile, pt, meta);
    std::vector<ckpt::TensorToWrite> ot;
    for (const auto& s : optim) {
      ot.push_back({s.name, DType::F32, s.shape, s.data, nullptr});
      index["optim"][s.name] = tensor_record(ofile, s.shape, s.data, size_t(numel(s.shape)) * sizeof(float));
    }
    fault("optimizer");
    ckpt::write_safetensors(tmp / ofile, ot, meta);
    fault("rank_index");
    write_json_atomic(tmp / fmt::format("rank-{}.json", R), index);
  });

  agree(world, "manifest", st.step, [&] {
    if (R != 0) return;
    json tensors = {{"params", json::object()}, {"optim", json::object()}};
    std::map<std::string, int> writer;  // "params/NAME" -> rank, to refuse a tensor written twice
    json files = json::array();
    for (int r = 0; r < W; ++r) {
      const json idx = read_json_file(tmp / fmt::format("rank-{}.json", r));
      files.push_back(fmt::format("rank-{}.safetensors", r));
      files.push_back(fmt::format("rank-{}.optim.safetensors", r));
      for (const char* key : {"params", "optim"})
        for (const auto& [name, rec] : idx.at(key).items()) {
          auto [it, fresh] = writer.emplace(std::string(key) + "/" + name, r);
          TREX_CHECK(fresh, "sharded checkpoint of step {}: '{}' was written by rank {} and rank {} (each tensor must "
                     "have one writer)", st.step, name, it->second, r);
          tensors[key][name] = rec;
        }
    }
    json m = {{"format", kFormat},
              {"step", st.step},
              {"layout", {{"pp", mesh.spec.pp}, {"dp", mesh.spec.dp}, {"ep", mesh.spec.ep}, {"vpp", mesh.spec.vpp},
                          {"tp", mesh.spec.tp}, {"etp", mesh.spec.etp}, {"world", W}}},
              {"state", st.to_json()},
              {"optimizer_steps", optimizer_steps},
              {"files", files},
              {"tensors", tensors},
              {"config", args.config}};
    fault("manifest");
    write_json_atomic(tmp / "manifest.json", m);
    fsync_dir(tmp);
    fault("rename");
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step
    fs::rename(tmp, final_dir);
    fsync_dir(root);
    // Keep the newest keep_last complete checkpoints; temporaries of interrupted saves go too.
    auto all = list_checkpoints(root);
    for (size_t i = 0; i + size_t(args.keep_last) < all.size(); ++i) fs::remove_all(all[i].second);
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".tmp-", 0) == 0) {
        std::error_code ec;
        fs::remove_all(e.path(), ec);
      }
    }
  });
  return final_dir;
}

fs::path consolidate_checkpoint(const fs::path& dir, const fs::path& root) {
  CheckpointReader r(dir);
  const int64_t step = r.state().step;
  fs::create_directories(root);
  const fs::path final_dir = root / step_dir_name(step);
  const fs::path tmp = root / (".tmp-consolidate-" + step_dir_name(step));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    const json meta = {{"format", "pt"}, {"producer", "trex ckpt consolidate"}};
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<ckpt::TensorToWrite> t;
      for (const auto& name : kind == 0 ? r.param_names() : r.optim_names()) {
        const Shape shape = kind == 0 ? r.param_shape(name) : r.optim_shape(name);
        t.push_back({name, DType::F32, shape, nullptr, [&r, kind, name, shape](void* dst) {
                       if (kind == 0) r.read_param(name, shape, static_cast<float*>(dst));
                       else r.read_optim(name, shape, static_cast<float*>(dst));
                     }});
      }
      ckpt::write_safetensors(tmp / (kind == 0 ? "model.safetensors" : "optimizer.safetensors"), t, meta);
    }
    json state = r.state().to_json();
    state["optimizer_steps"] = r.optimizer_steps();
    json groups = json::object();
    if (r.sharded())
      for (const auto& [name, rec] : r.manifest().at("tensors").at("params").items())
        groups[name] = rec.value("group", std::string("unknown"));
    state["param_groups"] = groups;
    write_json_atomic(tmp / "state.json", state);
    fsync_dir(tmp);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);
    fsync_dir(root);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  return final_dir;
}

}  // namespace trex::train
