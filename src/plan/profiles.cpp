#include "plan/profiles.h"

#include <algorithm>

#include "core/error.h"
#include "core/files.h"

namespace trex::plan {

namespace {

double num(const nlohmann::json& j, const char* key, const std::string& where, bool required, double fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    TREX_CHECK(!required, "{}: missing key '{}'", where, key);
    return fallback;
  }
  TREX_CHECK(j[key].is_number(), "{}: key '{}' must be a number", where, key);
  double v = j[key].get<double>();
  TREX_CHECK(v >= 0, "{}: key '{}' must be >= 0, got {}", where, key, v);
  return v;
}

fs::path hardware_dir() { return source_dir() / "configs" / "hardware"; }

}  // namespace

HardwareProfile parse_hardware(const nlohmann::json& j, const std::string& where) {
  TREX_CHECK(j.is_object(), "{}: a hardware profile must be a JSON object", where);
  HardwareProfile h;
  h.name = j.value("name", std::string("custom"));
  h.device = j.value("device", h.name);
  h.peak_bf16 = num(j, "peak_bf16_tflops", where, true, 0) * 1e12;
  h.peak_fp8 = num(j, "peak_fp8_tflops", where, false, 0) * 1e12;
  h.hbm_gib = num(j, "hbm_gib", where, true, 0);
  h.hbm_bw = num(j, "hbm_tbps", where, true, 0) * 1e12;
  h.reserved_gib = num(j, "reserved_gib", where, false, 0);
  h.devices_per_node = int64_t(num(j, "devices_per_node", where, true, 0));
  h.scaleup_domain = int64_t(num(j, "scaleup_domain", where, false, double(h.devices_per_node)));
  h.scaleup_bw = num(j, "scaleup_gbps", where, true, 0) * 1e9;
  h.scaleout_bw = num(j, "scaleout_gbps", where, true, 0) * 1e9;
  h.scaleup_latency = num(j, "scaleup_latency_us", where, false, 5) * 1e-6;
  h.scaleout_latency = num(j, "scaleout_latency_us", where, false, 10) * 1e-6;
  h.host_gib = num(j, "host_gib_per_device", where, false, 0);
  h.host_bw = num(j, "host_gbps", where, false, 0) * 1e9;
  TREX_CHECK(h.peak_bf16 > 0 && h.hbm_gib > 0 && h.hbm_bw > 0 && h.scaleup_bw > 0 && h.scaleout_bw > 0,
             "{}: peak_bf16_tflops, hbm_gib, hbm_tbps, scaleup_gbps and scaleout_gbps must be > 0", where);
  TREX_CHECK(h.devices_per_node >= 1 && h.scaleup_domain >= h.devices_per_node,
             "{}: need devices_per_node >= 1 and scaleup_domain >= devices_per_node", where);
  TREX_CHECK(h.reserved_gib < h.hbm_gib, "{}: reserved_gib {} must be below hbm_gib {}", where, h.reserved_gib,
             h.hbm_gib);
  h.source = j;
  return h;
}

std::vector<std::string> hardware_profile_names() {
  std::vector<std::string> names;
  if (fs::exists(hardware_dir()))
    for (const auto& e : fs::directory_iterator(hardware_dir()))
      if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

HardwareProfile load_hardware(const std::string& name_or_path, const std::vector<std::string>& overrides) {
  fs::path path = name_or_path;
  if (!fs::exists(path)) path = hardware_dir() / (name_or_path + ".json");
  if (!fs::exists(path)) {
    std::string known;
    for (const auto& n : hardware_profile_names()) known += (known.empty() ? "" : ", ") + n;
    fail("hardware profile '{}' is neither a file nor one of: {}", name_or_path, known);
  }
  nlohmann::json j = read_json_file(path);
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    TREX_CHECK(eq != std::string::npos && eq > 0, "hardware override '{}' must be key=value", o);
    std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    TREX_CHECK(j.contains(key), "hardware override '{}': {} has no key '{}'", o, path.string(), key);
    try {
      j[key] = std::stod(value);
    } catch (const std::exception&) {
      j[key] = value;
    }
  }
  return parse_hardware(j, path.string());
}

ImplProfile parse_impl(const nlohmann::json& j, const std::string& where) {
  TREX_CHECK(j.is_object(), "{}: an implementation profile must be a JSON object", where);
  ImplProfile p;
  p.name = j.value("name", p.name);
  p.note = j.value("note", p.note);
  p.calibrated = j.value("calibrated", false);
  auto rd = [&](const char* key, double& field) { field = num(j, key, where, false, field); };
  rd("eff_dense", p.eff_dense);
  rd("eff_expert", p.eff_expert);
  rd("expert_half_tokens", p.expert_half_tokens);
  rd("eff_attn", p.eff_attn);
  rd("eff_hbm", p.eff_hbm);
  rd("eff_comm", p.eff_comm);
  rd("elementwise_factor", p.elementwise_factor);
  rd("block_overhead_s", p.block_overhead_s);
  rd("step_overhead_s", p.step_overhead_s);
  rd("dp_block_overhead_s", p.dp_block_overhead_s);
  rd("emulated_copy_s", p.emulated_copy_s);
  rd("weight_bytes", p.weight_bytes);
  rd("grad_bytes", p.grad_bytes);
  rd("master_bytes", p.master_bytes);
  rd("adam_bytes", p.adam_bytes);
  rd("muon_bytes", p.muon_bytes);
  rd("act_scale", p.act_scale);
  rd("act_quadratic_bytes", p.act_quadratic_bytes);
  rd("logits_bytes", p.logits_bytes);
  rd("fixed_gib", p.fixed_gib);
  rd("ep_overlap", p.ep_overlap);
  rd("tp_overlap", p.tp_overlap);
  rd("pp_overlap", p.pp_overlap);
  rd("dp_overlap", p.dp_overlap);
  rd("swap_overlap", p.swap_overlap);
  p.default_zero = int(num(j, "default_zero", where, false, p.default_zero));
  std::string attn = j.value("attn_compute", std::string("sparse"));
  TREX_CHECK(attn == "sparse" || attn == "dense_masked", "{}: attn_compute must be sparse or dense_masked, got '{}'",
             where, attn);
  p.attn_compute = attn == "sparse" ? AttnCompute::Sparse : AttnCompute::DenseMasked;
  for (double e : {p.eff_dense, p.eff_expert, p.eff_attn, p.eff_hbm})
    TREX_CHECK(e > 0 && e <= 1.0, "{}: efficiencies must be in (0, 1], got {}", where, e);
  for (double o : {p.ep_overlap, p.tp_overlap, p.pp_overlap, p.dp_overlap, p.swap_overlap})
    TREX_CHECK(o <= 1.0, "{}: overlap fractions must be in [0, 1], got {}", where, o);
  return p;
}

nlohmann::json impl_to_json(const ImplProfile& p) {
  return {{"name", p.name},
          {"note", p.note},
          {"calibrated", p.calibrated},
          {"eff_dense", p.eff_dense},
          {"eff_expert", p.eff_expert},
          {"expert_half_tokens", p.expert_half_tokens},
          {"eff_attn", p.eff_attn},
          {"eff_hbm", p.eff_hbm},
          {"eff_comm", p.eff_comm},
          {"elementwise_factor", p.elementwise_factor},
          {"block_overhead_s", p.block_overhead_s},
          {"step_overhead_s", p.step_overhead_s},
          {"dp_block_overhead_s", p.dp_block_overhead_s},
          {"emulated_copy_s", p.emulated_copy_s},
          {"attn_compute", p.attn_compute == AttnCompute::Sparse ? "sparse" : "dense_masked"},
          {"weight_bytes", p.weight_bytes},
          {"grad_bytes", p.grad_bytes},
          {"master_bytes", p.master_bytes},
          {"adam_bytes", p.adam_bytes},
          {"muon_bytes", p.muon_bytes},
          {"act_scale", p.act_scale},
          {"act_quadratic_bytes", p.act_quadratic_bytes},
          {"logits_bytes", p.logits_bytes},
          {"fixed_gib", p.fixed_gib},
          {"ep_overlap", p.ep_overlap},
          {"tp_overlap", p.tp_overlap},
          {"pp_overlap", p.pp_overlap},
          {"dp_overlap", p.dp_overlap},
          {"swap_overlap", p.swap_overlap},
          {"default_zero", p.default_zero}};
}

ImplProfile load_impl(const std::string& name_or_path) {
  if (name_or_path.empty() || name_or_path == "trex-prior") return ImplProfile{};
  if (name_or_path == "hf_baseline-prior") {
    // transformers + PyTorch as shared/bench/hf_baseline.py runs it: bf16 parameters, bf16 gradients,
    // bf16 AdamW moments (same dtype as the parameters), no master copy, eager masked attention, FSDP2.
    ImplProfile p;
    p.name = "hf_baseline-prior";
    p.note = "transformers/PyTorch baseline, uncalibrated";
    p.weight_bytes = 2, p.grad_bytes = 2, p.master_bytes = 0, p.adam_bytes = 4, p.muon_bytes = 2;
    p.attn_compute = AttnCompute::DenseMasked;
    p.logits_bytes = 10;
    p.default_zero = 3;
    p.ep_overlap = p.tp_overlap = p.pp_overlap = 0;
    return p;
  }
  TREX_CHECK(fs::exists(name_or_path),
             "implementation profile '{}' is neither trex-prior, hf_baseline-prior nor an existing file",
             name_or_path);
  nlohmann::json j = read_json_file(name_or_path);
  // A calibration file holds the fitted profile under "profile".
  if (j.contains("profile")) return parse_impl(j["profile"], name_or_path);
  return parse_impl(j, name_or_path);
}

}  // namespace trex::plan
