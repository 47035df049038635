#include "plan/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <sstream>

#include "core/error.h"

namespace trex::plan {

std::string to_string(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}
std::string to_string(Offload o) { return o == Offload::None ? "none" : "swap"; }
std::string to_string(Optimizer o) { return o == Optimizer::AdamW ? "adamw" : "muon"; }

std::string to_string(const Layout& l) {
  std::string s = fmt::format("TP{},PP{}", l.tp, l.pp);
  if (l.vpp > 1) s += fmt::format(",VPP{}", l.vpp);
  s += fmt::format(",EP{}", l.ep);
  if (l.etp > 1) s += fmt::format(",ETP{}", l.etp);
  if (l.cp > 1) s += fmt::format(",CP{}", l.cp);
  s += fmt::format(",DP{},MBS{}", l.dp, l.mbs);
  if (l.recompute != Recompute::None) s += ",RC=" + to_string(l.recompute);
  if (l.recompute == Recompute::Full && l.rc_full_layers >= 0) s += fmt::format(",RCL={}", l.rc_full_layers);
  if (l.offload != Offload::None) s += ",OFF=" + to_string(l.offload);
  if (l.zero != 1) s += fmt::format(",ZERO={}", l.zero);
  if (!l.overlap) s += ",OVL=0";
  return s;
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none" || s == "0") return Recompute::None;
  if (s == "selective" || s == "sel") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  fail("recompute policy '{}' is not none, selective or full", s);
}

Optimizer parse_optimizer(const std::string& s) {
  if (s == "adamw" || s == "adam") return Optimizer::AdamW;
  if (s == "muon") return Optimizer::Muon;
  fail("optimizer '{}' is not adamw or muon", s);
}

Layout parse_layout(const std::string& text) {
  Layout l;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(std::remove_if(item.begin(), item.end(), [](unsigned char c) { return std::isspace(c); }),
               item.end());
    if (item.empty()) continue;
    std::string up = item;
    for (auto& c : up) c = char(std::toupper(static_cast<unsigned char>(c)));
    auto eq = up.find('=');
    if (eq != std::string::npos) {
      std::string key = up.substr(0, eq), value = item.substr(eq + 1);
      for (auto& c : value) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (key == "RC" || key == "RECOMPUTE") {
        l.recompute = parse_recompute(value);
      } else if (key == "RCL") {
        TREX_CHECK(!value.empty() && std::all_of(value.begin(), value.end(), ::isdigit),
                   "layout '{}': RCL (the layers replayed in full under RC=full) must be a count >= 0", text);
        l.rc_full_layers = std::stoll(value);
      } else if (key == "OFF" || key == "OFFLOAD") {
        TREX_CHECK(value == "none" || value == "swap", "layout '{}': OFF must be none or swap", text);
        l.offload = value == "swap" ? Offload::Swap : Offload::None;
      } else if (key == "ZERO") {
        TREX_CHECK(value == "0" || value == "1" || value == "2" || value == "3",
                   "layout '{}': ZERO must be 0, 1, 2 or 3", text);
        l.zero = std::stoi(value);
      } else if (key == "OVL" || key == "OVERLAP") {
        TREX_CHECK(value == "0" || value == "1", "layout '{}': OVL must be 0 or 1", text);
        l.overlap = value == "1";
      } else {
        fail("layout '{}': unknown setting '{}'", text, item);
      }
      continue;
    }
    size_t digits = up.find_first_of("0123456789");
    TREX_CHECK(digits != std::string::npos && digits > 0, "layout '{}': '{}' must look like TP2 or RC=full", text,
               item);
    std::string key = up.substr(0, digits), value = up.substr(digits);
    TREX_CHECK(std::all_of(value.begin(), value.end(), ::isdigit), "layout '{}': '{}' needs an integer", text, item);
    int64_t v = std::stoll(value);
    TREX_CHECK(v >= 1, "layout '{}': '{}' must be >= 1", text, item);
    if (key == "TP") l.tp = v;
    else if (key == "PP") l.pp = v;
    else if (key == "VPP") l.vpp = v;
    else if (key == "EP") l.ep = v;
    else if (key == "ETP") l.etp = v;
    else if (key == "CP") l.cp = v;
    else if (key == "DP") l.dp = v;
    else if (key == "MBS") l.mbs = v;
    else fail("layout '{}': unknown dimension '{}' (TP, PP, VPP, EP, ETP, CP, DP, MBS)", text, key);
  }
  TREX_CHECK(l.rc_full_layers < 0 || l.recompute == Recompute::Full,
             "layout '{}': RCL (layers replayed in full) goes with RC=full", text);
  return l;
}

int64_t micro_batches(const Layout& l, const Workload& w) { return w.gbs / (l.dp * l.mbs); }

std::string check_layout(const ModelSpec& m, const HardwareProfile& hw, const Workload& w, int64_t devices,
                         Layout& l) {
  if (devices < 1) return "the device count must be >= 1";
  const int64_t model_par = l.tp * l.pp * l.cp;
  if (devices % model_par != 0)
    return fmt::format("TP{} x PP{} x CP{} = {} does not divide {} devices", l.tp, l.pp, l.cp, model_par, devices);
  const int64_t dp = devices / model_par;
  if (l.dp != 0 && l.dp != dp)
    return fmt::format("DP{} given, but {} devices / (TP x PP x CP = {}) = {}", l.dp, devices, model_par, dp);
  l.dp = dp;
  if (m.n_heads % l.tp != 0 || m.o_groups % l.tp != 0 || m.index_n_heads % l.tp != 0)
    return fmt::format("TP{} must divide the attention heads ({}), output groups ({}) and indexer heads ({})", l.tp,
                       m.n_heads, m.o_groups, m.index_n_heads);
  if (l.tp > hw.devices_per_node)
    return fmt::format("TP{} spans more than one node ({} devices per node)", l.tp, hw.devices_per_node);
  if (m.n_routed_experts % l.ep != 0)
    return fmt::format("EP{} does not divide the {} routed experts", l.ep, m.n_routed_experts);
  const int64_t stage_ranks = l.tp * l.cp * l.dp;
  if (stage_ranks % (l.ep * l.etp) != 0)
    return fmt::format("EP{} x ETP{} must divide the {} ranks of a pipeline stage (TP x CP x DP)", l.ep, l.etp,
                       stage_ranks);
  if (l.etp > 1 && (m.moe_inter % l.etp != 0 || l.tp % l.etp != 0))
    return fmt::format("ETP{} must divide TP{} and the expert width {}", l.etp, l.tp, m.moe_inter);
  const int64_t blocks = m.n_layers + (w.mtp && m.n_mtp > 0 ? 1 : 0);
  if (l.pp * l.vpp > blocks)
    return fmt::format("PP{} x VPP{} = {} virtual stages exceed the {} blocks", l.pp, l.vpp, l.pp * l.vpp, blocks);
  if (l.vpp > 1 && l.pp == 1) return "VPP needs PP > 1";
  if (w.gbs % (l.dp * l.mbs) != 0)
    return fmt::format("global batch {} is not a multiple of DP{} x MBS{}", w.gbs, l.dp, l.mbs);
  const int64_t mb = micro_batches(l, w);
  if (l.vpp > 1 && mb % l.pp != 0)
    return fmt::format("interleaved 1F1B needs the {} micro-batches per rank to be a multiple of PP{}", mb, l.pp);
  if (l.cp > 1 && w.seq % (2 * l.cp) != 0)
    return fmt::format("sequence {} is not a multiple of 2 x CP{}", w.seq, l.cp);
  if (l.cp > 1 && w.seq / l.cp < 2 * m.window)
    return fmt::format("CP{} leaves {} tokens per rank, shorter than two sliding windows", l.cp, w.seq / l.cp);
  if (l.zero >= 2 && l.offload == Offload::Swap) return "optimizer swap is modelled for ZeRO-0/1 only";
  if (w.precision == Precision::FP8 && hw.peak_fp8 <= 0)
    return fmt::format("{} has no FP8 matmul peak in its profile", hw.name);
  if (l.offload == Offload::Swap && (hw.host_gib <= 0 || hw.host_bw <= 0))
    return fmt::format("{} profile has no host memory / bandwidth for optimizer swap", hw.name);
  if (w.fill <= 0 || w.fill > 1) return fmt::format("fill {} must be in (0, 1]", w.fill);
  return "";
}

}  // namespace trex::plan
