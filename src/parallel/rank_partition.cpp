#include "parallel/rank_partition.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/dsv4/partition.h"

namespace trex::parallel {

std::string RankPartition::describe() const {
  return fmt::format("rank {} of {} (pp={} dp={} ep={} tp={}): stage {} (layers [{}, {}){}{}), dp rank {}, ep rank "
                     "{}, edp rank {} of {}, tp rank {}, experts [{}, {}), {} micro-batches of {} sequences, {} in "
                     "flight",
                     world_rank, world_size, spec.pp, spec.dp, spec.ep, spec.tp, pp_rank, layer_begin, layer_end,
                     embed ? ", embedding" : "", head ? ", head" : "", dp_rank, ep_rank, edp_rank, edp_size,
                     tp_rank, expert_begin, expert_end, micro_batches, micro_batch_seqs, in_flight);
}

RankPartition rank_partition(const MeshSpec& spec, int rank, const dsv4::ModelConfig& cfg, int64_t global_batch,
                             int64_t micro_batch_seqs) {
  const int world = spec.pp * spec.dp * spec.tp;
  const std::string why =
      check_mesh(spec, world, ModelShape{int(cfg.n_layers), int(cfg.n_routed_experts), int(cfg.n_heads),
                                         int(cfg.o_groups), int(cfg.moe_inter * cfg.n_shared_experts)});
  TREX_CHECK(why.empty(), "layout pp={},dp={},ep={},vpp={}: {}", spec.pp, spec.dp, spec.ep, spec.vpp, why);
  TREX_CHECK(spec.vpp == 1, "layout pp={},dp={},ep={},vpp={}: the rank emulation builds one 1F1B stage per rank "
             "only (interleaved stages, vpp > 1, run in `trex train --device cuda`, not emulated yet)", spec.pp,
             spec.dp, spec.ep, spec.vpp);
  TREX_CHECK(rank >= 0 && rank < world, "rank {} outside the layout's {} ranks (pp={} x dp={} x tp={})", rank,
             world, spec.pp, spec.dp, spec.tp);
  TREX_CHECK(micro_batch_seqs >= 1 && global_batch >= 1 && global_batch % (int64_t(spec.dp) * micro_batch_seqs) == 0,
             "global batch {} does not cut into dp={} ranks x micro-batches of {} sequences", global_batch, spec.dp,
             micro_batch_seqs);
  RankPartition p;
  p.spec = spec;
  p.world_rank = rank, p.world_size = world;
  p.tp_rank = rank % spec.tp;  // mesh.h: TP innermost, stages outermost
  p.pp_rank = rank / spec.tp / spec.dp, p.dp_rank = rank / spec.tp % spec.dp;
  p.ep_rank = p.dp_rank % spec.ep, p.edp_rank = p.dp_rank / spec.ep, p.edp_size = spec.dp / spec.ep;
  const dsv4::ModelPartition part = dsv4::split_layers(cfg, spec.pp)[size_t(p.pp_rank)];
  p.layer_begin = part.layer_begin, p.layer_end = part.layer_end, p.embed = part.embed, p.head = part.head;
  TREX_CHECK(p.layer_end > p.layer_begin, "layout pp={}: stage {} gets no layer of the {}", spec.pp, p.pp_rank,
             cfg.n_layers);
  const int64_t per = cfg.n_routed_experts / spec.ep;
  p.expert_begin = p.ep_rank * per, p.expert_end = p.expert_begin + per;
  p.micro_batch_seqs = micro_batch_seqs;
  p.micro_batches = global_batch / (int64_t(spec.dp) * micro_batch_seqs);
  p.stage_slots = spec.pp - p.pp_rank;
  p.in_flight = std::min<int64_t>(p.stage_slots, p.micro_batches);
  return p;
}

EmulatedMesh make_emulated_mesh(const RankPartition& p, comm::EmulatedGroup::Payload payload) {
  EmulatedMesh m;
  const int D = p.spec.dp, E = p.spec.ep;
  if (D > 1) {
    // GpuModel splits its DP group by EP rank (key: DP rank) for the expert-data-parallel replicas: D / E of them,
    // this rank at dp_rank / E (mesh.h's edp_rank).
    m.dp = std::make_unique<comm::EmulatedGroup>(p.dp_rank, D, "dp", [D, E](int, int key) {
      return std::make_pair(D / E, key / E);
    }, payload);
  }
  if (E > 1) m.ep = std::make_unique<comm::EmulatedGroup>(p.ep_rank, E, "ep", comm::EmulatedGroup::SplitRule{}, payload);
  if (p.spec.tp > 1) m.tp = std::make_unique<comm::EmulatedGroup>(p.tp_rank, p.spec.tp, "tp", comm::EmulatedGroup::SplitRule{}, payload);
  if (p.spec.pp > 1) {
    m.act = std::make_unique<comm::EmulatedGroup>(p.pp_rank, p.spec.pp, "pp.act");
    m.grad = std::make_unique<comm::EmulatedGroup>(p.pp_rank, p.spec.pp, "pp.grad");
  }
  return m;
}

}  // namespace trex::parallel
