// The emulated rank's step (emulated_rank.h).
#include "train/cuda/emulated_rank.h"

#include <random>

#include "core/error.h"
#include "model/dsv4/seq_layout.h"

namespace trex::train {

dsv4gpu::GpuModelOptions EmulatedRank::model_options(const parallel::RankPartition& p, parallel::EmulatedMesh& mesh,
                                                     dsv4gpu::GpuModelOptions o) {
  o.layer_begin = p.layer_begin, o.layer_end = p.layer_end;
  o.stage_slots = p.stage_slots;
  o.dp = mesh.dp.get(), o.ep = mesh.ep.get(), o.tp = mesh.tp.get();
  o.balanced_routing = true;
  return o;
}

EmulatedRank::EmulatedRank(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
                           dsv4gpu::GpuModelOptions base, uint64_t seed, comm::EmulatedGroup::Payload payload)
    : cfg_(cfg), p_(p), seq_(seq), mesh_(parallel::make_emulated_mesh(p, payload)) {
  // The emulated mesh has no tied-embedding group (the last stage's copy of embed.weight with MTP), and the
  // planner's emulated-rank predictions are made without MTP (`trex plan --no-mtp`): the emulation leaves it out.
  TREX_CHECK(cfg.n_mtp == 0, "emulated rank {}: the rank emulation runs without the MTP module (drop it from the "
             "config: num_nextn_predict_layers 0)", p.world_rank);
  TREX_CHECK(seq >= 1, "emulated rank {}: sequence length {}", p.world_rank, seq);
  model_ = std::make_unique<dsv4gpu::GpuModel>(cfg, model_options(p, mesh_, base));
  opt_ = std::make_unique<dsv4gpu::GpuOptimizer>(*model_);
  model_->init_random(seed);
  // The pipeline boundary: a fixed random stream (unit scale, as the RMS-normed streams) and a fixed random
  // gradient at the scale of a mean loss over the step's targets (every DP rank's), not the loop-back's zeros or
  // the stage's own output (comm/emulated_group.h says why zeros break the backward).
  if (mesh_.act) mesh_.act->set_recv_source(comm::ElemType::BF16, 1.0f, seed + 101);
  if (mesh_.grad)
    mesh_.grad->set_recv_source(comm::ElemType::F32, float(1.0 / (double(p.spec.dp) * double(tokens_per_step()))),
                                seed + 202);
  if (p.spec.pp > 1)
    pipe_ = std::make_unique<dsv4gpu::GpuPipeline>(*model_, *mesh_.act, *mesh_.grad, p.micro_batches);
  // This rank's tokens: random ids (the timing does not depend on them; routing is forced balanced).
  std::mt19937_64 g(seed + 1 + uint64_t(p.world_rank));
  ids_.resize(size_t(tokens_per_step()));
  for (auto& t : ids_) t = int32_t(g() % uint64_t(cfg.vocab_size));
  labels_ = ids_;
}

EmulatedRank::~EmulatedRank() = default;

double EmulatedRank::step(const cuda::AdamWStep& a) {
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(p_.micro_batch_seqs, seq_);
  model_->zero_grads();
  double loss = 0;
  if (pipe_) {
    loss = pipe_->step(ids_.data(), labels_.data(), mb);
  } else {  // one stage: the micro-batches in order, gradients reduced in the last one's backward
    const int64_t n = p_.micro_batch_seqs * seq_, M = p_.micro_batches;
    model_->begin_step(M * p_.micro_batch_seqs * (seq_ - 1), -1, M, M - 1);
    for (int64_t m = 0; m < M; ++m) {
      loss += model_->forward_stage(m, ids_.data() + m * n, labels_.data() + m * n, mb, nullptr);
      model_->backward_stage(m, nullptr);
    }
  }
  opt_->adamw_step(a);
  return loss;
}

std::map<std::string, std::map<std::string, comm::EmulatedOpStats>> EmulatedRank::comm_stats() const {
  std::map<std::string, std::map<std::string, comm::EmulatedOpStats>> out;
  for (const comm::EmulatedGroup* g : {mesh_.dp.get(), mesh_.ep.get(), mesh_.tp.get(), mesh_.act.get(), mesh_.grad.get()})
    if (g) out[g->name()] = g->stats();
  return out;
}

int64_t EmulatedRank::loopback_bytes() const {
  int64_t n = 0;
  for (const comm::EmulatedGroup* g : {mesh_.dp.get(), mesh_.ep.get(), mesh_.tp.get(), mesh_.act.get(), mesh_.grad.get()})
    if (g) n += g->loopback_bytes();
  return n;
}

}  // namespace trex::train
