#include "train/gpu_mesh_config.h"

#include <fmt/format.h>

#include <vector>

namespace trex::train {

std::string gpu_layout_gaps(const GpuLayoutAsk& a) {
  std::vector<std::string> gaps;
  auto need = [&](bool missing, const char* what) {
    if (missing) gaps.emplace_back(what);
  };
  need(a.tp > 1, "tensor parallelism");
  need(a.etp > 1, "expert tensor parallelism");
  need(a.cp > 1, "context parallelism");
  need(a.pp > 1, "pipeline stages under trex train (bench train only)");
  need(a.vpp > 1, "interleaved stages");
  need(a.ep > 1 && a.dp % a.ep != 0, "expert parallelism whose degree does not divide dp (EP folds into DP)");
  need(a.recompute, "activation recomputation");
  need(a.optimizer_offload, "optimizer offload");
  need(a.fully_sharded, "fully sharded dense weights");
  need(a.dp > 1 && 64 % a.dp != 0, "data parallelism whose degree does not divide 64 (the ZeRO-1 bucket slicing)");
  need(a.muon && a.dp > 1, "Muon under data parallelism");
  need(a.freeze, "freeze (the SFT recipe's frozen router)");
  need(a.mtp, "the MTP module in the GPU trainer");
  std::string out;
  for (const auto& g : gaps) out += (out.empty() ? "" : "; ") + g;
  return out;
}

std::string check_gpu_mesh_config(const TrainConfig& cfg, int world_size) {
  const parallel::MeshSpec m = cfg.parallel.present ? cfg.parallel.mesh : parallel::MeshSpec{1, world_size, 1, 1};
  if (cfg.model_type != "dsv4")
    return fmt::format("device cuda trains model type dsv4 only (not {})", cfg.model_type);
  if (m.pp > 1)
    return fmt::format(
        "pipeline stages (parallel.pp={}) are not run by `trex train --device cuda` yet: the GPU 1F1B pipeline "
        "(train/cuda/gpu_pipeline.h) runs only in `trex bench train` on random tokens; missing under the trainer: "
        "its step's target normaliser and loss, the stage-shared embedding's gradient, per-stage sharded "
        "checkpoints, and pp combined with dp / ep in the GPU model. Use pp: 1 (dp / ep on the GPU) or device cpu",
        m.pp);
  if (m.vpp > 1) return fmt::format("interleaved stages (parallel.vpp={}) are not implemented on the GPU", m.vpp);
  if (m.ep > 1 && m.dp % m.ep != 0)
    return fmt::format("parallel.ep={} does not divide parallel.dp={} (expert parallelism is folded into the "
                       "data-parallel ranks: each group of ep consecutive DP ranks holds all the experts)",
                       m.ep, m.dp);
  if (!cfg.freeze.empty())
    return "frozen parameters (freeze) are not implemented on the GPU; drop freeze or train with device cpu";
  if (m.dp > 1) {
    if (64 % m.dp != 0)
      return fmt::format("parallel.dp={} must divide 64 on the GPU (the ZeRO-1 bucket slicing)", m.dp);
    if (cfg.optimizer.kind != "adamw" || !cfg.optimizer.adamw.decay_vectors)
      return fmt::format(
          "optimizer kind {}{} is not implemented on the GPU under data parallelism (dp={}): a rank's ZeRO-1 shard "
          "is a flat slice of the parameter arena, while Muon orthogonalises whole matrices; use optimizer kind "
          "adamw with decay_vectors true, dp: 1, or device cpu",
          cfg.optimizer.kind, cfg.optimizer.kind == "adamw" ? " with decay_vectors false" : "", m.dp);
    const double alpha = cfg.model.value("balance_alpha", 1e-4);
    if (alpha != 0)
      return fmt::format(
          "the sequence-wise balance loss (model.balance_alpha={}) is not implemented on the GPU under data "
          "parallelism (dp={}); set model.balance_alpha: 0 (the router-bias update still balances the experts)",
          alpha, m.dp);
  }
  return {};
}

}  // namespace trex::train
