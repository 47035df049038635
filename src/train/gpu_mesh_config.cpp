#include "train/gpu_mesh_config.h"

#include <fmt/format.h>

#include <optional>
#include <vector>

#include "model/dsv4/config.h"

namespace trex::train {

namespace {
// Whether the run trains the MTP module: model.use_mtp (default true) and a model config with it (inline, or the
// config.json it names; an unreadable one is left to the model's own error).
bool trains_mtp(const TrainConfig& cfg) {
  if (!cfg.model.value("use_mtp", true)) return false;
  try {
    if (cfg.model.contains("dsv4")) return cfg.model["dsv4"].value("num_nextn_predict_layers", int64_t(0)) > 0;
    if (cfg.model.contains("config")) return dsv4::load_model_config(cfg.model["config"].get<std::string>()).n_mtp > 0;
  } catch (const std::exception&) {
  }
  return false;
}

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
  // replicated); Muon would orthogonalise each TP rank's slice of a split matrix instead of the matrix.
  need(a.tp > 1 && a.muon, "Muon under tensor parallelism (a TP-split matrix is not orthogonalised whole)");
  need(a.etp > 1, "expert tensor parallelism");
  need(a.cp > 1, "context parallelism");
  need(a.vpp > 1, "interleaved stages");
  need(a.ep > 1 && a.dp % a.ep != 0, "expert parallelism whose degree does not divide dp (EP folds into DP)");
  need(a.optimizer_offload, "optimizer offload");
  // ZeRO-3 (fully sharded dense weights, model/cuda/weight_gather.h) runs, with tp too.
  const bool zero3 = a.fully_sharded || a.zero >= 3;
  need(a.zero == 2 && a.muon, "Muon with sharded gradients (ZeRO-2 keeps no whole-matrix gradients)");
  need(zero3 && a.muon, "Muon with fully sharded weights (ZeRO-3 keeps no whole-matrix gradients)");
  need(a.mtp && a.ep > 1, "the MTP module under expert parallelism (its block's experts are not placed)");
  need(a.mtp && a.pp > 1, "the MTP module on pipeline stages (its input reads the first stage's embedding)");
  need(a.balance_loss && a.ep > 1, "the balance loss under expert parallelism");
  need(a.balance_loss && a.pp > 1, "the balance loss on pipeline stages");
  std::string out;
  for (const auto& g : gaps) out += (out.empty() ? "" : "; ") + g;
  return out;
}

std::string check_gpu_mesh_config(const TrainConfig& cfg, int world_size) {
  const parallel::MeshSpec m = cfg.parallel.present ? cfg.parallel.mesh : parallel::MeshSpec{1, world_size, 1, 1};
  if (cfg.model_type != "dsv4")
    return fmt::format("device cuda trains model type dsv4 only (not {})", cfg.model_type);
  if (m.tp > 1) {
    if (cfg.optimizer.kind == "muon")
      return fmt::format("Muon (optimizer.kind muon) under tensor parallelism (parallel.tp={}) is not implemented on "
                         "the GPU (each TP rank holds a slice of the split attention / shared-expert matrices, and "
                         "Newton-Schulz needs the whole matrix); use optimizer.kind: adamw or tp: 1",
                         m.tp);
    if (const auto mc = model_of(cfg)) {
      const int64_t fs = mc->moe_inter * mc->n_shared_experts;
      if (mc->n_heads % m.tp != 0)
        return fmt::format("parallel.tp={} does not divide the model's {} attention query heads", m.tp, mc->n_heads);
      if (mc->o_groups % m.tp != 0)
        return fmt::format("parallel.tp={} does not divide the attention's {} output-projection groups (o_groups)",
                           m.tp, mc->o_groups);
      if (fs % m.tp != 0)
        return fmt::format("parallel.tp={} does not divide the shared expert's hidden width {}", m.tp, fs);
    }
  }
  if (m.vpp > 1)
    return fmt::format("interleaved stages (parallel.vpp={}) are not implemented on the GPU: its pipeline "
                       "(train/cuda/gpu_pipeline.h) runs 1F1B over one layer range per rank; set vpp: 1",
                       m.vpp);
  // Pipeline stages (train/cuda/gpu_mesh_pipeline.h): the MTP module trains on the whole model only (its input
  // embeds token t+1 with the first stage's embedding), and the balance loss runs in whole-model steps only.
  if (m.pp > 1 && trains_mtp(cfg))
    return fmt::format("the MTP module (model.use_mtp) on pipeline stages (parallel.pp={}) is not implemented on "
                       "the GPU (its input reads embed.weight, which only the first stage holds); set "
                       "model.use_mtp: false or pp: 1",
                       m.pp);
  if (m.pp > 1 && cfg.model.value("balance_alpha", 1e-4) != 0)
    return fmt::format("the sequence-wise balance loss (model.balance_alpha={}) is not implemented on GPU pipeline "
                       "stages (parallel.pp={}); set model.balance_alpha: 0 or pp: 1",
                       cfg.model.value("balance_alpha", 1e-4), m.pp);
  // Dense partitioning (parallel.zero): ZeRO-1, ZeRO-2 and ZeRO-3 (fully sharded dense weights) run.
  if (cfg.parallel.zero >= 3 && cfg.optimizer.kind == "muon")
    return "parallel.zero 3 with optimizer.kind muon is not implemented on the GPU (Muon's Newton-Schulz reads "
           "whole-matrix gradients, which ZeRO-3 does not keep, as ZeRO-2); set zero: 1 or optimizer.kind: adamw";
  if (cfg.parallel.zero == 2 && cfg.optimizer.kind == "muon")
    return "parallel.zero 2 with optimizer.kind muon is not implemented on the GPU (Muon's Newton-Schulz reads "
           "whole-matrix gradients, which ZeRO-2 does not keep); set zero: 1 or optimizer.kind: adamw";
  if (m.ep > 1 && m.dp % m.ep != 0)
    return fmt::format("parallel.ep={} does not divide parallel.dp={} (expert parallelism is folded into the "
                       "data-parallel ranks: each group of ep consecutive DP ranks holds all the experts)",
                       m.ep, m.dp);
  // Under expert parallelism the GPU model places the main layers' experts only, and its balance loss does not
  // run in the expert exchange.
  if (m.ep > 1 && trains_mtp(cfg))
    return fmt::format("the MTP module (model.use_mtp) with expert parallelism (parallel.ep={}) is not implemented "
                       "on the GPU (the MTP block's experts are not placed); set model.use_mtp: false or ep: 1",
                       m.ep);
  const double alpha = cfg.model.value("balance_alpha", 1e-4);
  if (m.ep > 1 && alpha != 0)
    return fmt::format("the sequence-wise balance loss (model.balance_alpha={}) is not implemented on the GPU with "
                       "expert parallelism (parallel.ep={}); set model.balance_alpha: 0 or ep: 1",
                       alpha, m.ep);
  return {};
}

}  // namespace trex::train
