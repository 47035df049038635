#include "parallel/rank_partition.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/dsv4/partition.h"
#include "parallel/pipeline_schedule.h"

namespace trex::parallel {

int64_t RankPartition::layers() const {
  int64_t n = 0;
  for (const RankChunk& c : chunks) n += c.layer_end - c.layer_begin;
  return n;
}

std::string RankPartition::describe() const {
  std::string where;
  if (spec.vpp == 1) {
    where = fmt::format("layers [{}, {})", layer_begin, layer_end);
  } else {
    for (const RankChunk& c : chunks)
      where += fmt::format("{}virtual stage {} [{}, {}) x{}", where.empty() ? "" : ", ", c.virtual_stage,
                           c.layer_begin, c.layer_end, c.slots);
  }
  return fmt::format("rank {} of {} (pp={} vpp={} dp={} ep={} tp={}): stage {} ({}{}{}{}), dp rank {}, ep rank {}, "
                     "edp rank {} of {}, tp rank {}, experts [{}, {}), {} micro-batches of {} sequences, {} in flight",
                     world_rank, world_size, spec.pp, spec.vpp, spec.dp, spec.ep, spec.tp, pp_rank, where,
                     embed ? ", embedding" : "", head ? ", head" : "", mtp ? ", MTP" : "", dp_rank, ep_rank, edp_rank,
                     edp_size, tp_rank, expert_begin, expert_end, micro_batches, micro_batch_seqs, in_flight);
}

namespace {
// Per chunk of pipeline rank r: the most micro-batches live on it at once (forward done, backward pending) under
// the project's schedule (make_schedule: 1F1B or interleaved), the slots its GpuModel needs (as GpuPipeline::
// chunk_slots counts them).
std::vector<int> schedule_slots(int r, int P, int V, int64_t M) {
  ScheduleSpec spec;
  spec.pp = P, spec.vpp = V, spec.micro_batches = M;
  spec.kind = V > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
  const Schedule sch = make_schedule(spec);
  std::vector<int> live(size_t(V), 0), most(size_t(V), 1);
  for (const PipeAction& a : sch.ranks[size_t(r)]) {
    int& n = live[size_t(a.chunk)];
    if (a.op == PipeOp::Forward) most[size_t(a.chunk)] = std::max(most[size_t(a.chunk)], ++n);
    if (a.op == PipeOp::Backward) --n;
  }
  return most;
}
}  // namespace

RankPartition rank_partition(const MeshSpec& spec, int rank, const dsv4::ModelConfig& cfg, int64_t global_batch,
                             int64_t micro_batch_seqs, int64_t pad_layers) {
  const int world = spec.pp * spec.dp * spec.tp;
  const std::string why =
      check_mesh(spec, world, ModelShape{int(cfg.n_layers), int(cfg.n_routed_experts), int(cfg.n_heads),
                                         int(cfg.o_groups), int(cfg.moe_inter * cfg.n_shared_experts),
                                         int(cfg.moe_inter)});
  TREX_CHECK(why.empty(), "layout pp={},dp={},ep={},vpp={}: {}", spec.pp, spec.dp, spec.ep, spec.vpp, why);
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
  const int64_t per = cfg.n_routed_experts / spec.ep;
  p.expert_begin = p.ep_rank * per, p.expert_end = p.expert_begin + per;
  p.micro_batch_seqs = micro_batch_seqs;
  p.micro_batches = global_batch / (int64_t(spec.dp) * micro_batch_seqs);
  const int P = spec.pp, V = spec.vpp;
  if (V > 1) {
    ScheduleSpec ss;
    ss.pp = P, ss.vpp = V, ss.micro_batches = p.micro_batches, ss.kind = ScheduleKind::Interleaved;
    const std::string bad = check_schedule_spec(ss);
    TREX_CHECK(bad.empty(), "layout pp={},vpp={},dp={}: {} micro-batches of {} sequences per DP rank: {}", P, V,
               spec.dp, p.micro_batches, micro_batch_seqs, bad);
  }
  // The trainer's split (train/cuda/gpu_mesh_pipeline.h: split_layers over pp x vpp chunks, with its no-op padding
  // layers).
  const std::vector<dsv4::ModelPartition> parts = dsv4::split_layers(cfg, int64_t(P) * V, pad_layers);
  const std::vector<int> slots = V > 1 ? schedule_slots(p.pp_rank, P, V, p.micro_batches) : std::vector<int>{};
  for (int c = 0; c < V; ++c) {
    RankChunk k;
    k.virtual_stage = c * P + p.pp_rank;
    const dsv4::ModelPartition part = parts[size_t(k.virtual_stage)].resolved(cfg);
    k.layer_begin = part.layer_begin, k.layer_end = part.layer_end, k.embed = part.embed, k.head = part.head;
    TREX_CHECK(k.layer_end > k.layer_begin, "layout pp={},vpp={}: virtual stage {} (stage {}) gets no layer of the {}",
               P, V, k.virtual_stage, p.pp_rank, cfg.n_layers);
    // 1F1B: P - r slots (the trainer's set_gpu_stage), of which min(P - r, M) are ever used.
    k.slots = V > 1 ? slots[size_t(c)] : P - p.pp_rank;
    p.chunks.push_back(k);
  }
  p.layer_begin = p.chunks[0].layer_begin, p.layer_end = p.chunks[0].layer_end;
  p.embed = p.chunks.front().embed, p.head = p.chunks.back().head;
  p.stage_slots = p.chunks[0].slots;
  p.mtp = p.head && cfg.n_mtp > 0;
  p.tied_embedding = P > 1 && cfg.n_mtp > 0 && (p.embed || p.head);
  if (V == 1) {
    p.in_flight = std::min<int64_t>(p.stage_slots, p.micro_batches);
  } else {
    p.in_flight = 0;
    for (const RankChunk& k : p.chunks) p.in_flight += k.slots;
  }
  return p;
}

std::vector<const comm::EmulatedGroup*> EmulatedMesh::all() const {
  std::vector<const comm::EmulatedGroup*> v;
  for (const comm::EmulatedGroup* g :
       {dp.get(), ep.get(), tp.get(), act.get(), grad.get(), act_wrap.get(), grad_wrap.get(), embed.get()})
    if (g) v.push_back(g);
  return v;
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
    if (p.spec.vpp > 1) {
      m.act_wrap = std::make_unique<comm::EmulatedGroup>(p.pp_rank, p.spec.pp, "pp.act_wrap");
      m.grad_wrap = std::make_unique<comm::EmulatedGroup>(p.pp_rank, p.spec.pp, "pp.grad_wrap");
    }
    // The tied embedding's all-reduce (sum_tied_embedding_grads) between the first and the last stage.
    if (p.tied_embedding)
      m.embed = std::make_unique<comm::EmulatedGroup>(p.head ? 1 : 0, 2, "embed", comm::EmulatedGroup::SplitRule{},
                                                      payload);
  }
  return m;
}

}  // namespace trex::parallel
