#include "train/gpu_mesh_config.h"

#include <fmt/format.h>

#include <optional>
#include <vector>

#include "model/dsv4/config.h"

namespace trex::train {

namespace {
// The model config of the run (inline, or the config.json it names); nullopt when it cannot be read here (the
// model's own error comes later).
std::optional<dsv4::ModelConfig> model_of(const TrainConfig& cfg) {
  try {
    if (cfg.model.contains("dsv4")) return dsv4::parse_model_config(cfg.model["dsv4"], "model.dsv4");
    if (cfg.model.contains("config")) return dsv4::load_model_config(cfg.model["config"].get<std::string>());
  } catch (const std::exception&) {
  }
  return std::nullopt;
}
}  // namespace

std::string gpu_layout_gaps(const GpuLayoutAsk& a) {
  std::vector<std::string> gaps;
  auto need = [&](bool missing, const char* what) {
    if (missing) gaps.emplace_back(what);
  };
  // Tensor parallelism runs (GpuModelOptions::tp: attention heads and the shared expert split, the rest
  // replicated), with AdamW or Muon (a TP-split matrix's Newton-Schulz input is gathered whole over TP, under
  // ZeRO-2 / 3 from its bucket's transient DP gather).
  // Expert tensor parallelism runs at etp = tp (the routed experts split over the TP group like the shared expert).
  need(a.etp > 1 && a.etp != a.tp, "expert tensor parallelism other than etp = tp");
  need(a.cp > 1, "context parallelism");
  need(a.ep > 1 && a.dp % a.ep != 0, "expert parallelism whose degree does not divide dp (EP folds into DP)");
  need(a.optimizer_offload, "optimizer offload");
  // ZeRO-2 and ZeRO-3 (fully sharded dense weights, model/cuda/weight_gather.h) run with AdamW or Muon, with tp
  // too: Muon's Newton-Schulz inputs are all-gathered per bucket into a transient buffer (GpuOptimizer::step).
  std::string out;
  for (const auto& g : gaps) out += (out.empty() ? "" : "; ") + g;
  return out;
}

std::string check_gpu_mesh_config(const TrainConfig& cfg, int world_size) {
  const parallel::MeshSpec m = cfg.parallel.present ? cfg.parallel.mesh : parallel::MeshSpec{1, world_size, 1, 1};
  if (cfg.model_type != "dsv4")
    return fmt::format("device cuda trains model type dsv4 only (not {})", cfg.model_type);
  if (m.tp > 1) {
    if (const auto mc = model_of(cfg)) {
      const int64_t fs = mc->moe_inter * mc->n_shared_experts;
      if (mc->n_heads % m.tp != 0)
        return fmt::format("parallel.tp={} does not divide the model's {} attention query heads", m.tp, mc->n_heads);
      if (mc->o_groups % m.tp != 0)
        return fmt::format("parallel.tp={} does not divide the attention's {} output-projection groups (o_groups)",
                           m.tp, mc->o_groups);
      if (fs % m.tp != 0)
        return fmt::format("parallel.tp={} does not divide the shared expert's hidden width {}", m.tp, fs);
      if (m.etp > 1 && mc->moe_inter % (8 * m.etp) != 0)
        return fmt::format("parallel.etp={} does not split the routed experts' hidden width {} into multiples of 8",
                           m.etp, mc->moe_inter);
    }
  }
  if (m.etp != 1 && m.etp != m.tp)
    return fmt::format("parallel.etp={} must be 1 (routed experts whole on every TP rank) or parallel.tp={} (split "
                       "over the TP group)", m.etp, m.tp);
  // Interleaved stages (vpp > 1) run (train/cuda/gpu_pipeline.h: one GpuModel per chunk); the padded split must
  // leave every virtual stage a layer.
  if (m.pp > 1)
    if (const auto mc = model_of(cfg)) {
      const std::string pad = check_pad_layers(m, mc->n_layers, cfg.parallel.pad_layers);
      if (!pad.empty()) return pad;
    }
  // Dense partitioning (parallel.zero): ZeRO-1, ZeRO-2 and ZeRO-3 (fully sharded dense weights) run with AdamW
  // or Muon, with tp too (each bucket's Newton-Schulz inputs all-gathered over DP into a transient buffer, a
  // TP-split matrix's then gathered whole over TP from it).
  if (m.ep > 1 && m.dp % m.ep != 0)
    return fmt::format("parallel.ep={} does not divide parallel.dp={} (expert parallelism is folded into the "
                       "data-parallel ranks: each group of ep consecutive DP ranks holds all the experts)",
                       m.ep, m.dp);
  return {};
}

}  // namespace trex::train
