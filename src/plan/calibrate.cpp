#include "plan/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace trex::plan {

namespace {

ModelSpec resolve_model(const nlohmann::json& m, const std::string& where) {
  if (m.is_object()) return parse_model_spec(m, where + " (inline model)");
  TREX_CHECK(m.is_string(), "{}: 'model' must be a preset name, a config path or an inline config", where);
  std::string s = m.get<std::string>();
  if (is_model_preset(s)) return model_preset(s);
  for (const fs::path& p : {fs::path(s), shared_dir() / s, source_dir() / s})
    if (fs::exists(p)) return load_model_spec(p.string());
  fail("{}: model '{}' is not a preset and not found as a path, under {} or under {}", where, s,
       shared_dir().string(), source_dir().string());
}

// Nelder-Mead on an unconstrained vector; small problems only.
std::vector<double> minimize(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x0,
                             int iterations = 400) {
  const size_t n = x0.size();
  if (n == 0) return x0;
  std::vector<std::vector<double>> s(n + 1, x0);
  for (size_t i = 0; i < n; ++i) s[i + 1][i] += 0.5;
  std::vector<double> v(n + 1);
  for (size_t i = 0; i <= n; ++i) v[i] = f(s[i]);
  for (int it = 0; it < iterations; ++it) {
    std::vector<size_t> order(n + 1);
    for (size_t i = 0; i <= n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<std::vector<double>> s2;
    std::vector<double> v2;
    for (size_t i : order) s2.push_back(s[i]), v2.push_back(v[i]);
    s = s2, v = v2;
    std::vector<double> c(n, 0);
    for (size_t i = 0; i < n; ++i)
      for (size_t k = 0; k < n; ++k) c[k] += s[i][k] / double(n);
    auto along = [&](double t) {
      std::vector<double> p(n);
      for (size_t k = 0; k < n; ++k) p[k] = c[k] + t * (s[n][k] - c[k]);
      return p;
    };
    auto r = along(-1.0);
    double fr = f(r);
    if (fr < v[0]) {
      auto e = along(-2.0);
      double fe = f(e);
      if (fe < fr) s[n] = e, v[n] = fe;
      else s[n] = r, v[n] = fr;
    } else if (fr < v[n - 1]) {
      s[n] = r, v[n] = fr;
    } else {
      auto k = along(0.5);
      double fk = f(k);
      if (fk < v[n]) {
        s[n] = k, v[n] = fk;
      } else {
        for (size_t i = 1; i <= n; ++i) {
          for (size_t q = 0; q < n; ++q) s[i][q] = s[0][q] + 0.5 * (s[i][q] - s[0][q]);
          v[i] = f(s[i]);
        }
      }
    }
    if (std::fabs(v[n] - v[0]) < 1e-12) break;
  }
  size_t best = size_t(std::min_element(v.begin(), v.end()) - v.begin());
  return s[best];
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double logit(double p) {
  p = std::clamp(p, 1e-4, 1 - 1e-4);
  return std::log(p / (1 - p));
}

const HardwareProfile& cached_hardware(const std::string& name) {
  static std::map<std::string, HardwareProfile> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_hardware(name)).first;
  return it->second;
}

// The record's estimator, built once per record (the model's parameter table is the costly part: the fit
// evaluates every record hundreds of times) and given the profile of each evaluation.
Estimator& estimator_for(const Measurement& r, const ImplProfile& p) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Estimator>> cache;
  const std::string key = r.raw.dump();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto est = std::make_unique<Estimator>(r.model, cached_hardware(r.hardware), p, r.workload);
    if (r.emulated_stage >= 0) {  // the trainer's stage layers, not the planner's balanced split
      std::vector<std::vector<int64_t>> chunks;
      int64_t next = 0;
      for (int64_t n : r.stage_layers) {
        chunks.emplace_back();
        for (int64_t k = 0; k < n; ++k) chunks.back().push_back(next++);
      }
      // The MTP module (the planner's block n_layers) runs on the last stage, as the trainer places it.
      if (r.workload.mtp && r.model.n_mtp > 0) chunks.back().push_back(r.model.n_layers);
      est->set_partition(r.layout.pp, 1, chunks);
    }
    it = cache.emplace(key, std::move(est)).first;
  }
  it->second->set_impl(p);
  return *it->second;
}

Estimate predict(const Measurement& r, const ImplProfile& p) {
  Estimate e = estimator_for(r, p).estimate(r.layout, r.devices);
  TREX_CHECK(e.valid, "{}: record '{}' has a layout the planner refuses: {}", r.where, r.id, e.reason);
  return e;
}

}  // namespace

Measurement parse_measurement(const nlohmann::json& j, const std::string& where) {
  TREX_CHECK(j.is_object(), "{}: a measurement must be a JSON object", where);
  for (const char* key : {"id", "implementation", "hardware", "devices", "model", "layout", "seq", "gbs", "measured"})
    TREX_CHECK(j.contains(key), "{}: measurement is missing '{}'", where, key);
  Measurement m;
  m.where = where;
  m.raw = j;
  m.id = j["id"].get<std::string>();
  m.implementation = j["implementation"].get<std::string>();
  m.hardware = j["hardware"].get<std::string>();
  m.devices = j["devices"].get<int64_t>();
  TREX_CHECK(m.devices >= 1, "{}: devices must be >= 1", where);
  m.model = resolve_model(j["model"], where);
  m.layout = parse_layout(j["layout"].get<std::string>());
  m.workload.seq = j["seq"].get<int64_t>();
  m.workload.gbs = j["gbs"].get<int64_t>();
  m.workload.mode = j.value("mode", std::string("cpt"));
  m.workload.optimizer = parse_optimizer(j.value("optimizer", std::string("adamw")));
  std::string prec = j.value("precision", std::string("bf16"));
  TREX_CHECK(prec == "bf16" || prec == "fp8", "{}: precision must be bf16 or fp8", where);
  m.workload.precision = prec == "fp8" ? Precision::FP8 : Precision::BF16;
  m.workload.mtp = j.value("mtp", false);
  m.workload.frozen_router = j.value("frozen_router", false);
  m.workload.fill = j.value("fill", 1.0);
  const auto& meas = j["measured"];
  TREX_CHECK(meas.is_object() && meas.contains("step_s") && meas["step_s"].is_number(),
             "{}: 'measured' needs a numeric 'step_s'", where);
  m.step_s = meas["step_s"].get<double>();
  TREX_CHECK(m.step_s > 0, "{}: measured step_s must be > 0", where);
  if (meas.contains("peak_gib") && meas["peak_gib"].is_number()) m.peak_gib = meas["peak_gib"].get<double>();
  if (j.contains("emulated_rank")) {
    const auto& er = j["emulated_rank"];
    TREX_CHECK(er.is_object() && er.contains("stage") && er.contains("stage_layers") && er["stage_layers"].is_array(),
               "{}: 'emulated_rank' needs 'stage' and 'stage_layers' (layers per pipeline stage)", where);
    m.emulated_stage = er["stage"].get<int64_t>();
    m.stage_layers = er["stage_layers"].get<std::vector<int64_t>>();
    int64_t total = 0;
    for (int64_t n : m.stage_layers) {
      TREX_CHECK(n >= 1, "{}: emulated_rank: a stage of {} layers", where, n);
      total += n;
    }
    TREX_CHECK(int64_t(m.stage_layers.size()) == m.layout.pp && m.layout.vpp == 1,
               "{}: emulated_rank: {} stage_layers entries for layout {} (one per pipeline stage, no VPP)", where,
               m.stage_layers.size(), j["layout"].get<std::string>());
    TREX_CHECK(total == m.model.n_layers, "{}: emulated_rank: stage_layers cover {} layers, the model has {}", where,
               total, m.model.n_layers);
    TREX_CHECK(m.emulated_stage >= 0 && m.emulated_stage < m.layout.pp, "{}: emulated_rank: stage {} not in [0, {})",
               where, m.emulated_stage, m.layout.pp);
  }
  return m;
}

std::vector<Measurement> load_measurements(const std::string& path) {
  std::istringstream in(read_text_file(path));
  std::vector<Measurement> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      fail("{}: not valid JSON: {}", where, e.what());
    }
    out.push_back(parse_measurement(j, where));
  }
  return out;
}

void append_measurement(const std::string& path, const nlohmann::json& record) {
  parse_measurement(record, path + ":<new record>");
  std::string text = fs::exists(path) ? read_text_file(path) : std::string();
  if (!text.empty() && text.back() != '\n') text += '\n';
  text += record.dump() + "\n";
  write_text_atomic(path, text);
}

ImplProfile prior_for(const std::string& implementation) {
  if (implementation == "hf_baseline") {
    ImplProfile p = load_impl("hf_baseline-prior");
    p.name = "hf_baseline";
    return p;
  }
  ImplProfile p;
  p.name = implementation;
  if (implementation == "trex") {
    // Used when eff_attn is not fitted (fewer records than time parameters; the fit itself starts from a grid).
    // It is the core attention kernels' own rate, not the attention section's: `trex bench train --sections` puts
    // the core kernels (fwd + bwd `/core`) and the indexer top-k at 32.3 ms per flash-l4 @8192 step, which with the
    // planner's sparse-attention + indexer FLOPs for that step (3.60 TFLOP) is 112 TFLOP/s, 11.3% of the
    // 989.4 TFLOP/s peak (docs/performance.md). Dividing by whole attention sections would count the projections.
    p.eff_attn = 0.113;
  }
  return p;
}

std::vector<std::string> held_parameters(const std::string& implementation) {
  (void)implementation;  // none at present: every implementation's records span enough layouts
  return {};
}

Prediction predict_record(const Measurement& r, const ImplProfile& p) {
  const Estimate e = predict(r, p);
  if (r.emulated_stage < 0) return {e.time.step, e.mem.total};
  const size_t s = size_t(r.emulated_stage);
  return {e.stage_alone.at(s), e.stage_mem.at(s).total};
}

std::vector<PredictionCheck> check_predictions(const std::vector<Measurement>& records, const ImplProfile& p) {
  std::vector<PredictionCheck> out;
  for (const Measurement& r : records) {
    const Prediction e = predict_record(r, p);
    PredictionCheck c;
    c.id = r.id;
    c.note = r.note;
    c.measured_step = r.step_s;
    c.predicted_step = e.step_s;
    c.time_err = (e.step_s - r.step_s) / r.step_s;
    c.measured_peak = r.peak_gib;
    c.predicted_peak = e.peak_gib;
    c.mem_err = r.peak_gib > 0 ? (e.peak_gib - r.peak_gib) / r.peak_gib : 0.0;
    out.push_back(c);
  }
  return out;
}

std::vector<Measurement> current_measurements(const std::vector<Measurement>& records) {
  auto is_reference = [](const Measurement& r) { return r.devices == 1 && r.workload.gbs == 1; };
  auto same_reference = [](const Measurement& a, const Measurement& b) {
    return a.implementation == b.implementation && a.hardware == b.hardware &&
           a.raw.at("model").dump() == b.raw.at("model").dump() && a.workload.seq == b.workload.seq &&
           a.workload.mode == b.workload.mode && a.workload.optimizer == b.workload.optimizer &&
           a.workload.precision == b.workload.precision && a.workload.mtp == b.workload.mtp;
  };
  std::vector<Measurement> out;
  for (size_t i = 0; i < records.size(); ++i) {
    const Measurement& r = records[i];
    bool superseded = false;
    for (size_t k = i + 1; k < records.size() && !superseded; ++k) superseded = records[k].id == r.id;
    if (superseded) continue;
    Measurement c = r;
    if (!is_reference(r)) {
      const Measurement *then = nullptr, *now = nullptr;  // reference at the time of r, newest reference
      for (size_t k = 0; k < records.size(); ++k)
        if (is_reference(records[k]) && same_reference(records[k], r)) {
          if (k < i) then = &records[k];
          now = &records[k];
        }
      if (then != nullptr && now != then) {
        c.step_scale = now->step_s / then->step_s;
        c.step_s = r.step_s * c.step_scale;
        c.note = fmt::format("step x{:.3f} = {} {:.4f} s now / {:.4f} s when measured", c.step_scale, now->id,
                             now->step_s, then->step_s);
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::vector<Measurement>> group_measurements(const std::vector<Measurement>& records) {
  std::map<std::pair<std::string, std::string>, std::vector<Measurement>> g;
  for (const auto& r : records) g[{r.implementation, r.hardware}].push_back(r);
  std::vector<std::vector<Measurement>> out;
  for (auto& [k, v] : g) out.push_back(std::move(v));
  return out;
}

Calibration calibrate(const std::vector<Measurement>& records, const ImplProfile& prior) {
  TREX_CHECK(!records.empty(), "calibration needs at least one measurement");
  Calibration cal;
  cal.implementation = records[0].implementation;
  cal.hardware = records[0].hardware;
  for (const auto& r : records)
    TREX_CHECK(r.implementation == cal.implementation && r.hardware == cal.hardware,
               "{}: calibrate one implementation on one hardware at a time ({} on {}, not {} on {})", r.where,
               cal.implementation, cal.hardware, r.implementation, r.hardware);
  const size_t n_time = records.size();
  size_t n_mem = 0;
  bool multi = false;
  for (const auto& r : records) n_mem += r.peak_gib > 0, multi |= r.devices > 1;

  // Time: parameters in order of priority, never more than records.
  ImplProfile p = prior;
  std::vector<std::string> tnames = {"eff_dense", "eff_attn", "block_overhead_s"};
  if (multi) tnames.push_back("dp_block_overhead_s");
  bool emulated = false;
  for (const auto& r : records) emulated |= r.emulated_stage >= 0;
  if (emulated) tnames.push_back("emulated_copy_s");  // only emulated ranks issue local copies
  for (const auto& h : held_parameters(cal.implementation))
    tnames.erase(std::remove(tnames.begin(), tnames.end(), h), tnames.end());
  if (tnames.size() > n_time) tnames.resize(n_time);
  auto apply_time = [&](ImplProfile& q, const std::vector<double>& x) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (tnames[i] == "eff_dense") q.eff_dense = q.eff_expert = std::max(sigmoid(x[i]), 1e-3);
      if (tnames[i] == "eff_attn") q.eff_attn = std::max(sigmoid(x[i]), 1e-3);
      if (tnames[i] == "block_overhead_s") q.block_overhead_s = 0.1 * sigmoid(x[i]);
      if (tnames[i] == "dp_block_overhead_s") q.dp_block_overhead_s = 0.1 * sigmoid(x[i]);
      if (tnames[i] == "emulated_copy_s") q.emulated_copy_s = 2e-5 * sigmoid(x[i]);
    }
  };
  auto time_loss = [&](const std::vector<double>& x) {
    ImplProfile q = p;
    apply_time(q, x);
    double s = 0;
    for (const auto& r : records) s += std::pow(std::log(predict_record(r, q).step_s / r.step_s), 2);
    return s;
  };
  // Several starting points: the loss has shallow valleys where one efficiency trades against another.
  std::vector<double> best_x;
  double best_loss = 1e300;
  for (double e_mm : {0.1, 0.3, 0.6})
    for (double e_at : {0.05, 0.2, 0.5}) {
      std::vector<double> x0;
      for (const auto& n : tnames)
        x0.push_back(n == "eff_dense" ? logit(e_mm) : n == "eff_attn" ? logit(e_at) : logit(0.05));
      auto x = minimize(time_loss, x0);
      double v = time_loss(x);
      if (v < best_loss) best_loss = v, best_x = x;
    }
  apply_time(p, best_x);

  // Memory.
  std::vector<std::string> mnames = {"act_scale"};
  if (p.attn_compute == AttnCompute::DenseMasked) mnames.push_back("act_quadratic_bytes");
  mnames.push_back("fixed_gib");
  if (mnames.size() > n_mem) mnames.resize(n_mem);
  auto apply_mem = [&](ImplProfile& q, const std::vector<double>& x) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (mnames[i] == "act_scale") q.act_scale = std::exp(x[i]);
      if (mnames[i] == "act_quadratic_bytes") q.act_quadratic_bytes = std::exp(x[i]);
      if (mnames[i] == "fixed_gib") q.fixed_gib = std::exp(x[i]);
    }
  };
  std::vector<double> m0;
  for (const auto& n : mnames)
    m0.push_back(std::log(std::max(1e-3, n == "act_scale" ? p.act_scale
                                         : n == "fixed_gib" ? p.fixed_gib
                                                            : std::max(p.act_quadratic_bytes, 1.0))));
  auto mem_loss = [&](const std::vector<double>& x) {
    ImplProfile q = p;
    apply_mem(q, x);
    double s = 0;
    for (const auto& r : records)
      if (r.peak_gib > 0) s += std::pow(std::log(predict_record(r, q).peak_gib / r.peak_gib), 2);
    return s;
  };
  if (!mnames.empty()) apply_mem(p, minimize(mem_loss, m0));

  p.calibrated = true;
  p.note = fmt::format("fitted to {} measurement(s) of {} on {}", records.size(), cal.implementation, cal.hardware);
  cal.profile = p;
  cal.fitted = tnames;
  cal.fitted.insert(cal.fitted.end(), mnames.begin(), mnames.end());
  cal.checks = check_predictions(records, p);
  for (const auto& c : cal.checks) {
    cal.max_time_err = std::max(cal.max_time_err, std::fabs(c.time_err));
    if (c.measured_peak > 0) cal.max_mem_err = std::max(cal.max_mem_err, std::fabs(c.mem_err));
  }
  return cal;
}

nlohmann::json calibration_to_json(const Calibration& c) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& k : c.checks)
    checks.push_back({{"id", k.id},
                      {"note", k.note},
                      {"measured_step_s", k.measured_step},
                      {"predicted_step_s", k.predicted_step},
                      {"time_err", k.time_err},
                      {"measured_peak_gib", k.measured_peak},
                      {"predicted_peak_gib", k.predicted_peak},
                      {"mem_err", k.mem_err}});
  return {{"implementation", c.implementation},
          {"hardware", c.hardware},
          {"fitted", c.fitted},
          {"max_time_err", c.max_time_err},
          {"max_mem_err", c.max_mem_err},
          {"profile", impl_to_json(c.profile)},
          {"checks", checks}};
}

}  // namespace trex::plan
