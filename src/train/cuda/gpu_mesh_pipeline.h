// The pipeline stages of the GPU mesh engine (gpu_mesh_engine.h) when the mesh has pp > 1: each rank's GpuModel
// holds its stage's layers (dsv4::split_layers, the CPU trainer's split, so a checkpoint's tensors are found by the
// same names on any layout) combined with its stage's DP (ZeRO-1) and EP groups, and the step runs GpuPipeline's
// 1F1B over the rank's micro-batches (the same micro-batches on every stage of one DP index, as the CPU mesh
// engine deals them).
//
// The step's numbers, as the single-process step: every micro-batch's loss normaliser is its own labelled targets
// x the step's micro-batches (so the gradients, reduce-scattered over DP in the last backward, are those of the
// global batch's mean of micro-batch means); the loss is the last stage's (summed over DP by the engine); the
// clipping norm's squares are summed over the stages (each stage's ZeRO-1 shards' norm, dp_grad_norm). Each stage
// adds its own layers' sequence-wise balance terms to the loss (the engine's sum over the ranks collects them).
// The MTP module runs on the last stage (its head normaliser: the micro-batch's MTP targets x the step's
// micro-batches), which holds a tied copy of embed.weight (GpuModelOptions::embed_group, set up by the engine).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/batch.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/config.h"
#include "parallel/mesh.h"

namespace trex::dsv4gpu {
class GpuPipeline;
}

namespace trex::train {

// Sets the stage of the mesh's pipeline rank on the GPU model's options: its layers and its micro-batch slots
// (1F1B on rank r of P keeps P - r forwards in flight).
void set_gpu_stage(dsv4gpu::GpuModelOptions& go, const dsv4::ModelConfig& mc, const parallel::Mesh& mesh);
// The options of each of the rank's vpp chunks (chunk c: virtual stage c pp + pp_rank of dsv4::split_layers over
// pp x vpp chunks padded with pad_layers no-op layers, the CPU trainer's split) on top of `go`: its layers and the
// slots the schedule over micro_batches (per DP rank) needs on it. Errors name a chunk left without a layer.
std::vector<dsv4gpu::GpuModelOptions> gpu_stage_chunks(const dsv4gpu::GpuModelOptions& go,
                                                       const dsv4::ModelConfig& mc, const parallel::Mesh& mesh,
                                                       int64_t pad_layers, int64_t micro_batches);

class GpuMeshPipeline {
 public:
  // stage: this rank's GpuModel (set_gpu_stage's layers). The pipeline's two directions run on the mesh's pp_group
  // (activations) and a second split of `world` over the same ranks (gradients): collective over the world.
  // micro_batches: this DP rank's per step. Connects the stages (collective over the pp group).
  GpuMeshPipeline(dsv4gpu::GpuModel& stage, parallel::Mesh& mesh, comm::Communicator& world, int64_t micro_batches);
  // Interleaved stages (mesh vpp > 1): the rank's chunks (gpu_stage_chunks' models, in chunk order); two more
  // splits of `world` carry the last rank -> rank 0 activations and rank 0 -> last rank gradients.
  GpuMeshPipeline(std::vector<dsv4gpu::GpuModel*> chunks, parallel::Mesh& mesh, comm::Communicator& world,
                  int64_t micro_batches);
  ~GpuMeshPipeline();
  GpuMeshPipeline(const GpuMeshPipeline&) = delete;
  GpuMeshPipeline& operator=(const GpuMeshPipeline&) = delete;

  bool last_stage() const;
  // Forward and backward of this DP rank's micro-batches (step order) through the pipeline, gradients
  // accumulated into the stage's (zeroed before). n_micro: the step's micro-batches over every DP rank.
  // after_forward(k): right after micro-batch k's forward on this stage (its slot's router selections are valid).
  // Returns this DP rank's share of the step's loss: the last stage's CE (and MTP) plus this stage's balance terms.
  double step(const std::vector<data::Batch>& mine, int64_t n_micro, const std::function<void(int64_t)>& after_forward);
  // The same with chunks: after_forward(k, c) right after micro-batch k's forward on chunk c.
  double step_chunks(const std::vector<data::Batch>& mine, int64_t n_micro,
                     const std::function<void(int64_t, int)>& after_forward);
  // The last step's timings on this rank (the pipeline's per-operation CUDA events are drained every step, so a
  // long run does not accumulate them): seconds the host waited for boundary tensors (bubble + exposed
  // transfer), and the device seconds of the stage's forwards and backwards.
  struct StepTimes {
    double wait_s = 0, forward_s = 0, backward_s = 0;
  };
  const StepTimes& last_times() const { return times_; }
  // The schedule's ideal bubble fraction, (P - 1) / (V M + P - 1) (1F1B: V = 1).
  double ideal_bubble_fraction() const;
  // The model's global gradient norm from this stage's (the same on every rank of the stage): the stages' squares
  // summed over the world (each stage counted once, by its DP rank 0). Collective over `host_world`.
  double global_norm(double stage_norm, comm::Communicator& host_world) const;

 private:
  parallel::Mesh& mesh_;
  std::unique_ptr<comm::Communicator> grad_;  // the gradient direction's communicator over the pipeline ranks
  std::unique_ptr<comm::Communicator> act_wrap_, grad_wrap_;  // vpp > 1: the last <-> first rank hops
  std::unique_ptr<dsv4gpu::GpuPipeline> pipe_;
  int64_t micro_batches_ = 1;
  bool mtp_ = false;  // this stage runs the MTP module (the last stage, when the model has it)
  int64_t vocab_ = 0;
  StepTimes times_;
};

}  // namespace trex::train
