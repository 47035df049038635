#include "train/cuda/gpu_mesh_pipeline.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/cuda/gpu_impl.h"
#include "model/dsv4/loss.h"
#include "model/dsv4/partition.h"
#include "train/cuda/gpu_pipeline.h"
#include "train/dsv4_trainable.h"

namespace trex::train {

void set_gpu_stage(dsv4gpu::GpuModelOptions& go, const dsv4::ModelConfig& mc, const parallel::Mesh& mesh) {
  const int P = mesh.spec.pp;
  const dsv4::ModelPartition part = dsv4::split_layers(mc, P)[size_t(mesh.pp_rank)].resolved(mc);
  TREX_CHECK(part.layer_end > part.layer_begin, "GPU pipeline rank {}: stage {} of {} gets no layer of the model's {}",
             mesh.world_rank, mesh.pp_rank, P, mc.n_layers);
  go.layer_begin = part.layer_begin, go.layer_end = part.layer_end;
  go.stage_slots = P - mesh.pp_rank;
}

std::vector<dsv4gpu::GpuModelOptions> gpu_stage_chunks(const dsv4gpu::GpuModelOptions& go,
                                                       const dsv4::ModelConfig& mc, const parallel::Mesh& mesh,
                                                       int64_t pad_layers, int64_t micro_batches) {
  const int P = mesh.spec.pp, V = mesh.spec.vpp;
  const std::vector<dsv4::ModelPartition> parts = dsv4::split_layers(mc, int64_t(P) * V, pad_layers);
  const std::vector<int> slots = dsv4gpu::GpuPipeline::chunk_slots(mesh.pp_rank, P, V, micro_batches);
  std::vector<dsv4gpu::GpuModelOptions> out;
  for (int c = 0; c < V; ++c) {
    const int g = c * P + mesh.pp_rank;
    const dsv4::ModelPartition part = parts[size_t(g)].resolved(mc);
    TREX_CHECK(part.layer_end > part.layer_begin, "GPU pipeline rank {}: virtual stage {} of pp={} x vpp={} gets no "
               "layer of the model's {} (pad_layers {})", mesh.world_rank, g, P, V, mc.n_layers, pad_layers);
    dsv4gpu::GpuModelOptions o = go;
    o.layer_begin = part.layer_begin, o.layer_end = part.layer_end;
    o.stage_slots = slots[size_t(c)];
    out.push_back(o);
  }
  return out;
}

GpuMeshPipeline::GpuMeshPipeline(dsv4gpu::GpuModel& stage, parallel::Mesh& mesh, comm::Communicator& world,
                                 int64_t micro_batches)
    : GpuMeshPipeline(std::vector<dsv4gpu::GpuModel*>{&stage}, mesh, world, micro_batches) {}

GpuMeshPipeline::GpuMeshPipeline(std::vector<dsv4gpu::GpuModel*> chunks, parallel::Mesh& mesh,
                                 comm::Communicator& world, int64_t micro_batches)
    : mesh_(mesh),
      micro_batches_(micro_batches),
      mtp_(chunks.back()->impl().mtp()),
      vocab_(chunks.back()->impl().cfg.vocab_size) {
  TREX_CHECK(mesh.pp_group && mesh.pp_group->size() == mesh.spec.pp,
             "GPU pipeline rank {}: the mesh has no pipeline group of {} stages", mesh.world_rank, mesh.spec.pp);
  TREX_CHECK(int(chunks.size()) == mesh.spec.vpp, "GPU pipeline rank {}: {} model chunks for vpp={}",
             mesh.world_rank, chunks.size(), mesh.spec.vpp);
  // Each direction on its own communicator (gpu_pipeline.h: one serial stream for both would deadlock).
  // (The colour of mesh.pp_group: the stages of one DP rank and one tensor-parallel rank.)
  const int colour = mesh.dp_rank * mesh.spec.tp + mesh.tp_rank;
  grad_ = world.split(colour, mesh.pp_rank);
  if (mesh.spec.vpp > 1) {
    act_wrap_ = world.split(colour, mesh.pp_rank);
    grad_wrap_ = world.split(colour, mesh.pp_rank);
  }
  pipe_ = std::make_unique<dsv4gpu::GpuPipeline>(std::move(chunks), *mesh.pp_group, *grad_, act_wrap_.get(),
                                                 grad_wrap_.get(), micro_batches);
}

GpuMeshPipeline::~GpuMeshPipeline() = default;

bool GpuMeshPipeline::last_stage() const { return mesh_.pp_rank == mesh_.spec.pp - 1; }

double GpuMeshPipeline::step(const std::vector<data::Batch>& mine, int64_t n_micro,
                             const std::function<void(int64_t)>& after_forward) {
  std::function<void(int64_t, int)> each;
  if (after_forward) each = [&after_forward](int64_t k, int) { after_forward(k); };
  return step_chunks(mine, n_micro, each);
}

double GpuMeshPipeline::step_chunks(const std::vector<data::Batch>& mine, int64_t n_micro,
                                    const std::function<void(int64_t, int)>& after_forward) {
  std::vector<dsv4::SeqLayout> layouts;
  layouts.reserve(mine.size());  // the micro-batches point into it
  std::vector<dsv4gpu::GpuPipeline::MicroBatch> mbs;
  for (const data::Batch& b : mine) {
    layouts.push_back(batch_layout(b));
    // Its own labelled targets x the step's micro-batches: the sum over the DP ranks' micro-batches is the
    // global batch's mean of micro-batch means (the dp path's normaliser).
    // The MTP head's likewise (the last stage runs it): its targets are token t + 2 within t's document.
    int64_t mtp_norm = -1;
    if (mtp_) {
      const dsv4::SeqLayout& l = layouts.back();
      const std::vector<int32_t> t = dsv4::shifted_targets(b.labels.data(), l.doc_start.data(), b.batch, b.seq, 2,
                                                           vocab_);
      mtp_norm = int64_t(std::count_if(t.begin(), t.end(), [](int32_t x) { return x >= 0; })) * n_micro;
    }
    mbs.push_back({b.input_ids.data(), b.labels.data(), &layouts.back(), b.n_targets * n_micro, mtp_norm});
  }
  const double loss = pipe_->step_chunks(mbs, n_micro, after_forward);
  const dsv4gpu::PipelineStats st = pipe_->stats();
  times_ = {st.recv_wait_ms / 1e3, st.fwd_ms / 1e3, st.bwd_ms / 1e3};
  pipe_->reset_stats();
  return loss;
}

double GpuMeshPipeline::ideal_bubble_fraction() const {
  const double P = mesh_.spec.pp, V = mesh_.spec.vpp, M = double(micro_batches_);
  return (P - 1) / (V * M + P - 1);
}

double GpuMeshPipeline::global_norm(double stage_norm, comm::Communicator& host_world) const {
  // One rank per stage (its DP and TP ranks all hold the stage's norm).
  double sq = mesh_.dp_rank == 0 && mesh_.tp_rank == 0 ? stage_norm * stage_norm : 0.0;
  host_world.all_reduce(&sq, 1, comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
  return std::sqrt(sq);
}

}  // namespace trex::train
