#include "optim/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace trex::optim {

namespace {
template <typename T>
void read_opt(const nlohmann::json& j, const char* key, T& out, const std::string& where) {
  if (!j.contains(key)) return;
  try {
    out = j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: optimizer.{}: {}", where, key, e.what());
  }
}
void check_keys(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& where) {
  TREX_CHECK(j.is_object(), "{}: expected a mapping", where);
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known |= it.key() == k;
    TREX_CHECK(known, "{}: unknown key '{}'", where, it.key());
  }
}
}  // namespace

OptimizerConfig parse_optimizer_config(const nlohmann::json& j, const std::string& where) {
  OptimizerConfig c;
  if (j.is_null()) return c;
  check_keys(j, {"kind", "adamw", "muon", "muon_lr_scale", "clip_grad_norm"}, where);
  read_opt(j, "kind", c.kind, where);
  TREX_CHECK(c.kind == "muon" || c.kind == "adamw", "{}: optimizer.kind '{}' (expected muon or adamw)", where, c.kind);
  read_opt(j, "muon_lr_scale", c.muon_lr_scale, where);
  read_opt(j, "clip_grad_norm", c.clip_grad_norm, where);
  if (j.contains("adamw")) {
    const auto& a = j["adamw"];
    check_keys(a, {"beta1", "beta2", "eps", "weight_decay", "decay_vectors"}, where + ": optimizer.adamw");
    read_opt(a, "beta1", c.adamw.beta1, where);
    read_opt(a, "beta2", c.adamw.beta2, where);
    read_opt(a, "eps", c.adamw.eps, where);
    read_opt(a, "weight_decay", c.adamw.weight_decay, where);
    read_opt(a, "decay_vectors", c.adamw.decay_vectors, where);
  }
  if (j.contains("muon")) {
    const auto& m = j["muon"];
    check_keys(m, {"momentum", "nesterov", "ns_fast_steps", "ns_final_steps", "update_rms", "weight_decay"},
               where + ": optimizer.muon");
    read_opt(m, "momentum", c.muon.momentum, where);
    read_opt(m, "nesterov", c.muon.nesterov, where);
    read_opt(m, "ns_fast_steps", c.muon.ns_fast_steps, where);
    read_opt(m, "ns_final_steps", c.muon.ns_final_steps, where);
    read_opt(m, "update_rms", c.muon.update_rms, where);
    read_opt(m, "weight_decay", c.muon.weight_decay, where);
  }
  return c;
}

Optimizer::Optimizer(std::vector<ParamRef> params, OptimizerConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  for (const auto& p : params_) {
    if (!p.trains()) continue;
    TREX_CHECK(p.grad != nullptr, "parameter {} trains but has no gradient buffer", p.name);
    Slot s;
    s.p = p;
    s.use_muon = cfg_.kind == "muon" && p.group == ParamGroup::Muon;
    if (s.use_muon)
      TREX_CHECK(p.shape.size() >= 2, "parameter {} {} is in the Muon group but is not a matrix", p.name,
                 shape_str(p.shape));
    s.m.assign(size_t(p.numel()), 0.0f);
    if (!s.use_muon) s.v.assign(size_t(p.numel()), 0.0f);
    slots_.push_back(std::move(s));
  }
}

double Optimizer::grad_norm() const {
  double ss = 0;
  for (const auto& s : slots_) ss += sum_squares(s.p.grad, s.p.numel());
  return std::sqrt(ss);
}

double Optimizer::clip_gradients() {
  double norm = grad_norm();
  if (cfg_.clip_grad_norm > 0 && norm > cfg_.clip_grad_norm && std::isfinite(norm)) {
    const float scale = float(cfg_.clip_grad_norm / (norm + 1e-6));
    for (auto& s : slots_) {
      float* g = s.p.grad;
      const int64_t n = s.p.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) g[i] *= scale;
    }
  }
  return norm;
}

void Optimizer::step(double lr) {
  ++step_;
  for (auto& s : slots_) {
    const int64_t n = s.p.numel();
    if (s.use_muon) {
      const int64_t cols = s.p.shape.back(), rows = s.p.shape[s.p.shape.size() - 2];
      const int64_t mats = n / (rows * cols);
      for (int64_t k = 0; k < mats; ++k) {
        const int64_t off = k * rows * cols;
        muon_update(s.p.value + off, s.p.grad + off, s.m.data() + off, rows, cols, lr * cfg_.muon_lr_scale,
                    cfg_.muon, work_);
      }
    } else {
      const bool decay = cfg_.adamw.decay_vectors || s.p.shape.size() >= 2;
      adamw_update(s.p.value, s.p.grad, s.m.data(), s.v.data(), n, lr, cfg_.adamw, step_, decay);
    }
  }
}

std::vector<StateTensor> Optimizer::state_tensors() {
  std::vector<StateTensor> out;
  for (auto& s : slots_) {
    if (s.use_muon) {
      out.push_back({s.p.name + ".momentum", s.p.shape, s.m.data()});
    } else {
      out.push_back({s.p.name + ".exp_avg", s.p.shape, s.m.data()});
      out.push_back({s.p.name + ".exp_avg_sq", s.p.shape, s.v.data()});
    }
  }
  return out;
}

}  // namespace trex::optim
