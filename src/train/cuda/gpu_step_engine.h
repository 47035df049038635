// One rank's DeepSeek-V4 training step on a GPU: the GPU model (model/cuda/gpu_model.h, public API only), its
// optimiser (gpu_optimizer.h) and, for a layout of several ranks, the NCCL communicators of the launcher's world:
//   - one GPU: forward (the LM head's CE gradient formed in it) + backward;
//   - dp = D (ZeRO-1 inside the model: gradients reduce-scattered by bucket, owners update, bf16 all-gather), with
//     ep = E folded into it (the MoE's dispatch / combine over the mesh's EP group; every rank keeps all experts);
//   - pp = P: one process per stage, the 1F1B schedule of gpu_pipeline.h over two direction communicators.
// `trex bench train` runs this step on random tokens and times it (`trex train --device cuda` runs the same model
// and optimiser through train/cuda/gpu_mesh_engine.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cuda/adamw.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/config.h"
#include "optim/optimizer.h"
#include "parallel/mesh.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_pipeline.h"

namespace trex::train {

struct GpuLayout {
  parallel::MeshSpec mesh;             // pp, dp, ep (vpp must be 1); all 1: one GPU without communicators
  int64_t micro_batches = 1;           // pipeline: micro-batches per step
  std::vector<int64_t> stage_layers;   // pipeline: layers per stage (empty: even, the remainder on the first)
  std::string text;                    // as given, for messages ("single" when empty)
  bool one_gpu() const { return mesh.pp == 1 && mesh.dp == 1 && mesh.ep == 1; }
};

// "dp=2", "ep=2" (EP folded into DP=2), "pp=2,micro_batches=8,stage_layers=3+1", or "" (one GPU). Pipeline
// parallelism combines with no dp / ep yet (refused).
GpuLayout parse_gpu_layout(const std::string& text);

class GpuStepEngine {
 public:
  // Several ranks: the world NCCL communicator from the launcher (comm_timeout_s: a stuck transfer aborts with the
  // rank and operation), split into the layout's groups; its size must be the layout's. mo: the model's options
  // (dp / ep / layer range / stage slots are set here from the layout).
  GpuStepEngine(const dsv4::ModelConfig& cfg, const GpuLayout& layout, dsv4gpu::GpuModelOptions mo,
                double comm_timeout_s = 600.0);
  ~GpuStepEngine();
  GpuStepEngine(const GpuStepEngine&) = delete;
  GpuStepEngine& operator=(const GpuStepEngine&) = delete;

  dsv4gpu::GpuModel& model() { return *model_; }
  dsv4gpu::GpuOptimizer& optimizer() { return *opt_; }
  const dsv4gpu::GpuModelOptions& model_options() const { return mo_; }
  const GpuLayout& layout() const { return layout_; }
  int world_rank() const;
  int world_size() const;
  int dp() const;       // data-parallel ranks (1 without)
  int dp_rank() const;
  int pp() const { return layout_.mesh.pp; }
  bool pipelined() const { return pipe_ != nullptr; }
  // Pipeline: the layers [begin, end) of every stage.
  const std::vector<int64_t>& stage_layer_counts() const { return counts_; }

  // The step. zero_grads() comes first (a training forward accumulates the LM head's gradient). forward_backward
  // runs this rank's tokens, ids / labels on the host in the model's label convention (data/batch.h): one GPU or
  // DP, [layout.B, layout.T]; pipeline, the step's micro_batches micro-batches of `layout` one after another.
  // after_forward (one GPU / DP only) runs between the forward and the backward (reads of the forward's
  // selections). Returns the loss: one GPU / DP, the global batch's mean (the model reduces over DP); pipeline, the
  // last stage's step mean, 0 elsewhere (global_losses).
  void zero_grads();
  double forward_backward(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout,
                          const std::function<void()>& after_forward = {});
  // The optimiser update: the run's optimiser with the CPU's definitions (GpuOptimizer::step), or the torch AdamW
  // of the benchmark baseline on every tensor. timed: its device time joins optimizer_ms (CUDA events).
  void optimizer_step(const optim::OptimizerConfig& c, double lr, int64_t step, float grad_scale = 1.f,
                      bool timed = false);
  void torch_adamw_step(const cuda::AdamWStep& a, bool timed = false);

  // Measurement (outside the timed steps: they synchronise).
  void synchronize();
  void barrier();                            // the world's (no-op on one GPU)
  // The activation table's peak of this rank's step (dsv4gpu::GpuModel::activation_plan, by the model's
  // recompute mode): one micro-batch's kept activations times the micro-batches this stage holds at once (1F1B:
  // min(P - stage, micro_batches); 1 without stages), plus one block's recomputation scratch.
  int64_t planned_activation_bytes(const dsv4::SeqLayout& micro_batch) const;
  void reset_peak_memory();                  // the device pool's high-water mark
  uint64_t peak_memory_bytes() const;
  uint64_t device_used_bytes() const;        // total - free
  double optimizer_ms() const { return opt_ms_; }
  void reset_stats();                        // optimizer_ms, pipeline stats and the model's sections
  dsv4gpu::PipelineStats pipeline_stats();   // pipeline only
  std::vector<double> global_losses(const std::vector<double>& local);  // pipeline: the last stage's, everywhere
  // Pipeline: the best of 3 transfers of one boundary tensor from stage 0 to stage 1 alone (ms).
  double boundary_transfer_ms(const dsv4::SeqLayout& layout);
  // Every rank's `mine` (same length everywhere), concatenated in rank order, on every rank.
  std::vector<double> all_gather(const std::vector<double>& mine);

 private:
  void timed_optimizer(const std::function<void()>& f, bool timed);

  GpuLayout layout_;
  dsv4gpu::GpuModelOptions mo_;
  std::unique_ptr<comm::Communicator> world_, act_, grad_;
  std::unique_ptr<comm::Communicator> embed_;  // pp > 1 with MTP: {first, last} stage (the tied embedding's sum)
  parallel::Mesh mesh_;
  std::vector<int64_t> counts_;
  std::unique_ptr<dsv4gpu::GpuModel> model_;
  std::unique_ptr<dsv4gpu::GpuOptimizer> opt_;
  std::unique_ptr<dsv4gpu::GpuPipeline> pipe_;
  double opt_ms_ = 0;
};

}  // namespace trex::train
