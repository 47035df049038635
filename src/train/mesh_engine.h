// The step engine of one rank of a device mesh (parallel/mesh.h), for the training loop of trainer.h. The step's
// global batch is the single-process one (grad_accum micro-batches of batch_size rows, drawn by the same seeded
// sampler on every rank); its micro-batches are dealt to the data-parallel ranks (DP rank d takes micro-batches
// d*M .. d*M+M-1 with M = grad_accum / dp), each DP rank runs its M micro-batches through its pipeline
// (parallel/pipeline_executor.h; expert exchanges happen inside the MoE layers over mesh.ep_group), gradients are
// reduce-scattered over DP by the ZeRO-1 optimiser (parallel/zero1_optimizer.h), clipped by the global norm, the
// owners update and all-gather, and router biases are updated from loads summed over DP. So the losses per step
// equal the single-process run of the same config (without its parallel section).
//
// Checkpoints: a one-process layout writes the ordinary state checkpoint (state_checkpoint.h), layouts of several
// processes the sharded one (sharded_checkpoint.h); load() (resume, spike rollback) reads the newest checkpoint of
// either format, whatever layout saved it: every rank reloads its parameters and optimiser state.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/batch.h"
#include "data/shards.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_executor.h"
#include "train/config.h"
#include "train/state_checkpoint.h"
#include "train/trainable.h"
#include "train/step_engine.h"

namespace trex::train {

// Called when a parameter group's gradients are final for the step (ZeRO-1 starts reducing them).
using GradsReady = std::function<void(const std::vector<std::string>& names)>;

// This rank's share of the model: its parameters, and running its micro-batches of a step.
class RankModel {
 public:
  virtual ~RankModel() = default;
  virtual std::vector<optim::ParamRef> params() = 0;  // this rank's tensors, model order
  virtual void zero_grads() = 0;
  virtual void set_controls(const StepControls&) {}
  // Forward and backward of this rank's micro-batches of the step; gradients accumulate as those of
  // grad_scale(M) x (1 / M) x the sum of the M micro-batch losses. before_final_backward is called once, right
  // before the backward after which no gradient of this rank changes any more (ZeRO-1 arms its reducer
  // there so buckets start during that backward). Returns the rank's loss contribution (the same scaling;
  // on a pipeline, the losses of this rank's stages) and fills the pipeline timings when pipelined.
  virtual double run_micro_batches(const std::vector<data::Batch>& mbs, const std::function<void()>& before_final_backward,
                                   parallel::PipelineStepStats* pipe) = 0;
  // The factor the gradient reduction still has to apply (a Trainable's gradients are those of the sum of the
  // micro-batch means: 1 / M; pipeline stages scale their losses by 1 / M themselves: 1).
  virtual double grad_scale(int64_t n_micro) const { return 1.0; }
  // Gradient-ready notifications during backward (optional; without them ZeRO-1 reduces after backward).
  virtual void set_grads_ready(GradsReady) {}
  // Sums the step's per-block expert loads over the DP group (parallel::all_reduce_expert_loads), so that
  // after_optimizer_step() updates the router biases from the global batch on every rank alike.
  virtual void sum_expert_loads(comm::Communicator& dp_group) {}
  virtual void after_optimizer_step() {}
  // Tensors held by several pipeline stages (a tied copy): their gradients are summed over the pipeline group.
  virtual std::vector<std::string> stage_shared_params() const { return {}; }
  virtual double flops_per_token(int64_t seq_len) const = 0;  // of the whole model
  virtual std::string describe() const = 0;
};

// pp = 1: the whole model (or, with expert parallelism, the model with this rank's experts) as a Trainable.
// A Dsv4Trainable's gradient-ready hook and expert loads are used when the trainable is one.
std::unique_ptr<RankModel> make_trainable_rank_model(std::unique_ptr<Trainable> model);

// pp > 1: this rank's pipeline chunks (chunks[v] is global stage v * pp + pp_rank) run by the executor.
// feed(mbs, loss_scale) hands every chunk the step's micro-batches before the schedule runs.
struct StagedParts {
  std::vector<parallel::PipelineStage*> chunks;
  std::function<void(const std::vector<data::Batch>& mbs, double loss_scale)> feed;
  std::function<std::vector<optim::ParamRef>()> params;
  std::function<void()> zero_grads;
  std::function<void(const StepControls&)> set_controls;
  std::function<void(GradsReady)> set_grads_ready;
  std::function<void(comm::Communicator&)> sum_expert_loads;
  std::function<void()> after_optimizer_step;
  std::vector<std::string> shared_params;
  std::function<double(int64_t)> flops_per_token;
  std::string description;
  std::shared_ptr<void> owner;  // keeps the objects behind the functions alive
};
std::unique_ptr<RankModel> make_pipelined_rank_model(StagedParts parts, comm::Communicator& pp_group,
                                                     const parallel::ScheduleSpec& spec);

class MeshEngine final : public StepEngine {
 public:
  // model: this rank's part (not owned); world and mesh outlive the engine.
  MeshEngine(const TrainConfig& cfg, comm::Communicator& world, parallel::Mesh& mesh, RankModel& model);
  ~MeshEngine() override;

  std::string describe() const override;
  int64_t n_params() const override;
  int64_t n_trained() const override;
  double flops_per_token(int64_t seq_len) const override { return model_.flops_per_token(seq_len); }
  int ranks() const override { return world_.size(); }
  bool lead() const override { return world_.rank() == 0; }
  bool runs_micro_batch(int64_t micro, int64_t n_micro) const override;
  void begin_step(const StepControls& c) override;
  EngineStep forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) override;
  double clip_gradients() override;
  void optimizer_step(double lr) override;
  void save(const std::filesystem::path& root, const TrainState& st, int64_t keep_last,
            const FaultHook& fault) override;
  TrainState load(const std::filesystem::path& dir) override;
  void barrier() override { world_.barrier(); }
  void max_over_ranks(double* v, int n) override;

 private:
  struct Opt;
  TrainConfig cfg_;
  comm::Communicator& world_;
  parallel::Mesh& mesh_;
  RankModel& model_;
  std::vector<optim::ParamRef> params_, shared_refs_;
  std::vector<std::string> shared_;
  std::unique_ptr<Opt> opt_;
};

}  // namespace trex::train
