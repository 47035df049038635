// The emulated rank's step (emulated_rank.h).
#include "train/cuda/emulated_rank.h"

#include <fmt/format.h>

#include <random>

#include "core/error.h"
#include "kernels/cuda/device_buffer.h"
#include "model/dsv4/seq_layout.h"

namespace trex::train {

dsv4gpu::GpuModelOptions EmulatedRank::model_options(const parallel::RankPartition& p, parallel::EmulatedMesh& mesh,
                                                     dsv4gpu::GpuModelOptions o, int chunk) {
  TREX_CHECK(chunk >= 0 && chunk < int(p.chunks.size()), "emulated rank {}: chunk {} of {}", p.world_rank, chunk,
             p.chunks.size());
  const parallel::RankChunk& c = p.chunks[size_t(chunk)];
  o.layer_begin = c.layer_begin, o.layer_end = c.layer_end;
  o.stage_slots = c.slots;
  o.dp = mesh.dp.get(), o.ep = mesh.ep.get(), o.tp = mesh.tp.get();
  o.expert_tp = p.spec.etp > 1;
  // The chunk holding embed.weight (virtual stage 0) or its MTP copy (the last one) joins the tied-embedding group.
  o.embed_group = mesh.embed && (c.embed || c.head) ? mesh.embed.get() : nullptr;
  o.balanced_routing = true;
  return o;
}

EmulatedRank::EmulatedRank(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
                           dsv4gpu::GpuModelOptions base, uint64_t seed, comm::EmulatedGroup::Payload payload)
    : cfg_(cfg), p_(p), seq_(seq), mesh_(parallel::make_emulated_mesh(p, payload)) {
  TREX_CHECK(seq >= 1, "emulated rank {}: sequence length {}", p.world_rank, seq);
  TREX_CHECK(p.mtp == (p.head && cfg.n_mtp > 0), "emulated rank {}: the partition was made for a config {} the MTP "
             "module, this one has {}", p.world_rank, p.mtp ? "with" : "without", cfg.n_mtp);
  try {
    for (int c = 0; c < int(p.chunks.size()); ++c) {
      models_.push_back(std::make_unique<dsv4gpu::GpuModel>(cfg, model_options(p, mesh_, base, c)));
      opts_.push_back(std::make_unique<dsv4gpu::GpuOptimizer>(*models_.back()));
      models_.back()->init_random(seed);  // the same seed on every chunk: the full model's values, each its part
    }
  } catch (const cuda::DeviceOutOfMemory& e) {
    throw cuda::DeviceOutOfMemory(e.bytes(), e.purpose(), fmt::format("emulated rank {}: building chunk {} of {}: {}. "
                                  "{}", p.world_rank, models_.size(), p.chunks.size(), e.what(), memory_report()));
  }
  // The pipeline boundary: a fixed random stream (unit scale, as the RMS-normed streams) and a fixed random
  // gradient at the scale of a mean loss over the step's targets (every DP rank's), not the loop-back's zeros or
  // the stage's own output (comm/emulated_group.h says why zeros break the backward). The wrap-around link of the
  // interleaved schedule likewise.
  for (comm::EmulatedGroup* g : {mesh_.act.get(), mesh_.act_wrap.get()})
    if (g) g->set_recv_source(comm::ElemType::BF16, 1.0f, seed + 101);
  for (comm::EmulatedGroup* g : {mesh_.grad.get(), mesh_.grad_wrap.get()})
    if (g)
      g->set_recv_source(comm::ElemType::F32, float(1.0 / (double(p.spec.dp) * double(tokens_per_step()))),
                         seed + 202);
  if (p.spec.pp > 1) {
    std::vector<dsv4gpu::GpuModel*> chunks;
    for (auto& m : models_) chunks.push_back(m.get());
    pipe_ = std::make_unique<dsv4gpu::GpuPipeline>(std::move(chunks), *mesh_.act, *mesh_.grad, mesh_.act_wrap.get(),
                                                   mesh_.grad_wrap.get(), p.micro_batches);
  }
  // This rank's tokens: random ids (the timing does not depend on them; routing is forced balanced).
  std::mt19937_64 g(seed + 1 + uint64_t(p.world_rank));
  ids_.resize(size_t(tokens_per_step()));
  for (auto& t : ids_) t = int32_t(g() % uint64_t(cfg.vocab_size));
  labels_ = ids_;
}

EmulatedRank::~EmulatedRank() = default;

double EmulatedRank::step(const cuda::AdamWStep& a) {
  try {
    return step_impl(a);
  } catch (const cuda::DeviceOutOfMemory& e) {
    throw cuda::DeviceOutOfMemory(e.bytes(), e.purpose(), fmt::format("emulated rank {}: in the step: {}. {}",
                                  p_.world_rank, e.what(), memory_report()));
  }
}

double EmulatedRank::step_impl(const cuda::AdamWStep& a) {
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(p_.micro_batch_seqs, seq_);
  for (auto& m : models_) m->zero_grads();
  double loss = 0;
  if (pipe_) {
    loss = pipe_->step(ids_.data(), labels_.data(), mb);
  } else {  // one stage: the micro-batches in order, gradients reduced in the last one's backward
    const int64_t n = p_.micro_batch_seqs * seq_, M = p_.micro_batches;
    // Every sequence labels its tokens but the last (the MTP head: but the last two).
    const int64_t mtp_targets = p_.mtp ? M * p_.micro_batch_seqs * (seq_ - 2) : -1;
    dsv4gpu::GpuModel& m0 = *models_[0];
    m0.begin_step(M * p_.micro_batch_seqs * (seq_ - 1), mtp_targets, M, M - 1);
    for (int64_t m = 0; m < M; ++m) {
      loss += m0.forward_stage(m, ids_.data() + m * n, labels_.data() + m * n, mb, nullptr);
      m0.backward_stage(m, nullptr);
    }
  }
  // MTP on a pipeline: the two embed.weight copies' gradients summed (an emulated all-reduce: the rank keeps its
  // own), as the trainer does before the norm and the update.
  for (auto& m : models_) m->sum_tied_embedding_grads();
  for (auto& o : opts_) o->adamw_step(a);
  return loss;
}

int64_t EmulatedRank::n_params() const {
  int64_t n = 0;
  for (const auto& m : models_) n += m->n_params();
  return n;
}

std::map<std::string, std::map<std::string, comm::EmulatedOpStats>> EmulatedRank::comm_stats() const {
  std::map<std::string, std::map<std::string, comm::EmulatedOpStats>> out;
  for (const comm::EmulatedGroup* g : mesh_.all()) out[g->name()] = g->stats();
  return out;
}

int64_t EmulatedRank::loopback_bytes() const {
  int64_t n = 0;
  for (const comm::EmulatedGroup* g : mesh_.all()) n += g->loopback_bytes();
  return n;
}

int64_t EmulatedRank::pipeline_buffer_bytes() const {
  if (!pipe_) return 0;
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(p_.micro_batch_seqs, seq_);
  const int64_t e = models_[0]->stream_elems(mb);
  const bool act_in = p_.pp_rank > 0 || p_.spec.vpp > 1, grad_in = p_.pp_rank < p_.spec.pp - 1 || p_.spec.vpp > 1;
  return 2 * ((act_in ? 2 * e : 0) + (grad_in ? 4 * e : 0));
}

}  // namespace trex::train
