// One rank's share of a pp x dp x ep layout (parallel/mesh.h's rank order and groups), computed without the other
// ranks: its coordinates, its pipeline stage's layers (dsv4::split_layers, the CPU trainer's rule), its routed
// experts, how many micro-batches its stage holds at once under 1F1B, and the emulated communicators that let it
// run alone on one device (comm/emulated_group.h; `trex bench train --emulate-rank R --layout ...`).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "comm/emulated_group.h"
#include "model/dsv4/config.h"
#include "parallel/mesh.h"

namespace trex::parallel {

struct RankPartition {
  MeshSpec spec;
  int world_rank = 0, world_size = 1;
  int pp_rank = 0, dp_rank = 0, ep_rank = 0, edp_rank = 0, edp_size = 1, tp_rank = 0;
  int64_t layer_begin = 0, layer_end = 0;  // main layers [begin, end) of the rank's stage
  bool embed = true, head = true;          // the first stage embeds, the last holds the head
  int64_t expert_begin = 0, expert_end = 0;  // routed experts held (all of them without EP)
  int stage_slots = 1;                     // the stage's activation slots for 1F1B: P - pp_rank
  int64_t in_flight = 1;                   // micro-batches whose activations it holds at once: min(P - pp_rank, M)
  int64_t micro_batches = 1;               // per step on each DP rank: global batch / (dp x micro-batch sequences)
  int64_t micro_batch_seqs = 1;
  std::string describe() const;            // one line: coordinates, layers, experts, in-flight micro-batches
};

// Rank `rank` of the layout for a model and a global batch of `global_batch` sequences cut into micro-batches of
// `micro_batch_seqs` sequences per DP rank. Errors (trex::Error) name the rule and the numbers: check_mesh's,
// a rank outside [0, pp x dp x tp), a batch that does not divide, vpp > 1 (not emulated yet). The
// TP ranks of a DP rank (TP innermost, mesh.h) share its stage, experts and micro-batches.
RankPartition rank_partition(const MeshSpec& spec, int rank, const dsv4::ModelConfig& cfg, int64_t global_batch,
                             int64_t micro_batch_seqs = 1);

// The rank's groups as emulated communicators (null where the degree is 1): dp (its split gives the expert-data-
// parallel group, as GpuModel asks for it), ep, tp (the attention's and shared expert's all-reduces) and the
// pipeline's two direction groups (act, grad). `payload` applies to the collectives (comm/emulated_group.h:
// CountOnly times the rank's own compute).
struct EmulatedMesh {
  std::unique_ptr<comm::EmulatedGroup> dp, ep, tp, act, grad;
};
EmulatedMesh make_emulated_mesh(const RankPartition& p,
                                comm::EmulatedGroup::Payload payload = comm::EmulatedGroup::Payload::Copy);

}  // namespace trex::parallel
