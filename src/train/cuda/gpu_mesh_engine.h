// The step engine of one rank of a GPU mesh for the training loop of trainer.h: every `trex train --device cuda`
// run (one GPU is a mesh of one rank; several under mpirun / srun / torchrun): the GPU model
// (model/cuda/gpu_model.h) with dp = D (ZeRO-1 inside the model: gradients reduce-scattered by bucket, owners
// update, bf16 all-gather) and ep = E folded into it (DP rank d is EP rank d mod E and holds only its E-th of the
// routed experts; the MoE's dispatch / combine runs over the mesh's EP group; the D / E replicas of the same
// experts shard those experts' master and moments as ZeRO-1 does, docs/parallel.md). The step's global batch is
// the single-process one: DP rank d runs micro-batches d*M .. d*M+M-1 (M = grad_accum / D), as the CPU mesh engine
// deals them.
//
// Exactly the single-process step: with D = 1 each micro-batch's forward is normalised by its own targets and the
// gradients scaled by 1 / M (the local engine's); with D > 1 each micro-batch runs as a stage step whose loss
// normalisers are its own labelled targets (main and MTP heads) x grad_accum and whose balance loss weighs
// 1 / grad_accum (GpuModel::begin_step), so the reduce-scatter sums the gradient of the global batch's mean of
// micro-batch means. Accumulation over M > 1 micro-batches keeps the reduced shard aside between backwards
// (GpuModel::add_reduced_grads_to). The loss and target counts are summed over the ranks; the clipping norm is the
// ZeRO-1 shards' (GpuModel::dp_grad_norm: each expert's reduced gradient counted once); router biases (the MTP
// block's too) are updated from the expert loads summed over the DP group (every rank shares every layer at pp = 1,
// and EP is folded into DP, so these are every rank's tokens).
//
// Pipeline stages (pp > 1, gpu_mesh_pipeline.h): each rank's GpuModel holds its stage's layers (with the stage's
// DP group as above) and the step runs 1F1B over its DP rank's micro-batches (with vpp > 1 each rank holds vpp chunks,
// one GpuModel each, on the interleaved schedule; parallel.pad_layers pads the split with no-op layers); the loss comes from the last stage,
// the clipping norm sums the stages' squares, each stage updates its own router biases and writes its own tensors.
//
// The V4 recipe as the CPU trainer runs it: the MTP module (model.use_mtp) with the schedule's weight per step; the
// freeze list (optim::apply_freeze: frozen tensors get no update, keep their moments, and leave the clipping norm);
// Muon or AdamW under any dp (gpu_optimizer.h); the sequence-wise balance loss.
//
// Checkpoints: the sharded manifest format of sharded_checkpoint.h (every tensor whole, by official name, written
// by one rank; AdamW moments as .exp_avg / .exp_avg_sq, Muon's as .momentum, none for frozen tensors), so a run
// resumes in another layout or on the CPU. A dense tensor is gathered from its ZeRO-1 slices over the DP group and
// written round robin; a routed expert under ep (and its moments) is written by its owner, the edp-rank-0 rank of
// those holding it, after a gather over its replicas only: no rank ever receives an expert it does not hold.
// load() reads either format from any layout, each rank only the tensors of its partition (the dense ones and its
// own experts).
//
// Start weights: model.init_from streams this rank's tensors from the checkpoint straight to the GPU
// (GpuModel::load_checkpoint, the load time printed); otherwise the host model's seeded init is copied over
// (the same values as one process and the CPU; every rank keeps its part); model.init_from_run then reads each
// tensor of the rank's partition by name.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/dsv4/config.h"
#include "train/config.h"
#include "train/dsv4_trainable.h"
#include "train/run.h"
#include "train/step_engine.h"

namespace trex::train {

class GpuMeshEngine final : public StepEngine {
 public:
  // world: this rank's communicator on device buffers (one rank per GPU; NCCL from the launcher, or a thread
  // group of ranks on one GPU), split here into the mesh of cfg.parallel (plain data parallelism over every rank
  // without a parallel section). It outlives the engine. mc / o: dsv4_model_setup's.
  GpuMeshEngine(const TrainConfig& cfg, const dsv4::ModelConfig& mc, const Dsv4TrainOptions& o,
                comm::Communicator& world);
  ~GpuMeshEngine() override;

  std::string describe() const override;
  int64_t n_params() const override;
  int64_t n_trained() const override;
  double flops_per_token(int64_t seq_len) const override;
  int ranks() const override;
  bool lead() const override;
  bool runs_micro_batch(int64_t micro, int64_t n_micro) const override;
  void begin_step(const StepControls& c) override;
  EngineStep forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) override;
  double clip_gradients() override;
  void optimizer_step(double lr) override;
  void save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
            const FaultHook& fault) override;
  TrainState load(const std::filesystem::path& dir) override;
  void barrier() override;
  void max_over_ranks(double* v, int n) override;

  // Host copies by official name (collective under dp: every rank calls them alike, in the same order; a routed
  // expert under ep comes from its owner). param_names: every trained tensor of the model and the router biases,
  // whatever this rank holds. Tests compare them with the local engine's.
  std::vector<float> value(const std::string& name);
  std::vector<std::string> param_names() const;
  // Host-buffer collectives over the world (train/cuda/staged_communicator.h).
  comm::Communicator& host_world();

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// `trex train --device cuda` (run.h): the NCCL world from the launcher (one process: a thread group of one rank),
// rank 0 prepares the run, this rank's GpuMeshEngine under the Trainer.
TrainResult run_gpu_mesh_training(const TrainConfig& cfg, const std::filesystem::path& config,
                                  const std::filesystem::path& out_dir, const RunOptions& opts);

}  // namespace trex::train
