// One rank's share of a pp x dp x ep layout (parallel/mesh.h's rank order and groups), computed without the other
// ranks: its coordinates, its pipeline stage's layers (dsv4::split_layers, the CPU trainer's rule), its routed
// experts, how many micro-batches its stage holds at once under 1F1B, and the emulated communicators that let it
// run alone on one device (comm/emulated_group.h; `trex bench train --emulate-rank R --layout ...`).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/emulated_group.h"
#include "model/dsv4/config.h"
#include "parallel/mesh.h"

namespace trex::parallel {

// One model chunk the rank holds: its pipeline stage (vpp 1) or one of its interleaved virtual stages (chunk c of
// pipeline rank r is virtual stage c pp + r of dsv4::split_layers over pp x vpp chunks, the trainer's split).
struct RankChunk {
  int virtual_stage = 0;
  int64_t layer_begin = 0, layer_end = 0;
  bool embed = false, head = false;  // virtual stage 0 embeds, the last holds the head (and the MTP module)
  int slots = 1;                     // the most micro-batches the schedule holds on it at once (its stage_slots)
};

struct RankPartition {
  MeshSpec spec;
  int world_rank = 0, world_size = 1;
  int pp_rank = 0, dp_rank = 0, ep_rank = 0, edp_rank = 0, edp_size = 1, tp_rank = 0;
  int64_t layer_begin = 0, layer_end = 0;  // main layers [begin, end) of the rank's stage (vpp > 1: chunk 0's)
  bool embed = true, head = true;          // the rank embeds (virtual stage 0) / holds the head (the last one)
  int64_t expert_begin = 0, expert_end = 0;  // routed experts held (all of them without EP)
  int stage_slots = 1;                     // the stage's activation slots for 1F1B: P - pp_rank (vpp > 1: chunk 0's)
  // Micro-batches whose activations it holds at once: 1F1B min(P - pp_rank, M); interleaved, the most chunk
  // micro-batches live at once over the schedule, summed over the chunks (each chunk ~1/vpp of a stage).
  int64_t in_flight = 1;
  int64_t micro_batches = 1;               // per step on each DP rank: global batch / (dp x micro-batch sequences)
  int64_t micro_batch_seqs = 1;
  std::vector<RankChunk> chunks;           // vpp of them, in chunk order (vpp 1: the stage)
  bool mtp = false;                        // the rank runs the MTP module (the config has it, the rank has the head)
  // pp > 1 with the MTP module: the rank holds one of the two copies of embed.weight (the first stage's, or the
  // last stage's for the MTP input), their gradients summed over the emulated mesh's `embed` group.
  bool tied_embedding = false;
  int64_t layers() const;                  // main layers over the chunks
  std::string describe() const;            // one line: coordinates, layers, experts, in-flight micro-batches
};

// Rank `rank` of the layout for a model and a global batch of `global_batch` sequences cut into micro-batches of
// `micro_batch_seqs` sequences per DP rank. Errors (trex::Error) name the rule and the numbers: check_mesh's,
// a rank outside [0, pp x dp x tp), a batch that does not divide, an interleaved schedule the micro-batches do not
// fit (parallel::check_schedule_spec: M a multiple of pp), a chunk left without a layer. The TP ranks of a DP rank
// (TP innermost, mesh.h) share its stage, experts and micro-batches. The MTP module (cfg.n_mtp > 0) runs on the
// rank holding the head.
// pad_layers: the trainer's parallel.pad_layers (no-op layers appended before the split, dsv4::split_layers).
RankPartition rank_partition(const MeshSpec& spec, int rank, const dsv4::ModelConfig& cfg, int64_t global_batch,
                             int64_t micro_batch_seqs = 1, int64_t pad_layers = 0);

// The rank's groups as emulated communicators (null where the degree is 1): dp (its split gives the expert-data-
// parallel group, as GpuModel asks for it), ep, tp (the attention's and shared expert's all-reduces) and the
// pipeline's two direction groups (act, grad). `payload` applies to the collectives (comm/emulated_group.h:
// CountOnly times the rank's own compute).
// With vpp > 1 two more direction groups carry the wrap-around hop (last rank -> rank 0 activations, rank 0 ->
// last rank gradients: GpuPipeline's act_wrap / grad_wrap), emulated locally like the others. With the MTP module
// on a pipeline the first and the last stage's ranks hold embed.weight: `embed` is their 2-rank tied-embedding
// group (GpuModelOptions::embed_group; rank 0 the first stage), null on the other stages.
struct EmulatedMesh {
  std::unique_ptr<comm::EmulatedGroup> dp, ep, tp, act, grad, act_wrap, grad_wrap, embed;
  std::vector<const comm::EmulatedGroup*> all() const;  // the non-null groups
};
EmulatedMesh make_emulated_mesh(const RankPartition& p,
                                comm::EmulatedGroup::Payload payload = comm::EmulatedGroup::Payload::Copy);

}  // namespace trex::parallel
