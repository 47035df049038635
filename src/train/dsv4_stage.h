// One pipeline stage (or one virtual stage of an interleaved schedule) of DeepSeek-V4 training, behind
// parallel::PipelineStage: a partitioned Model<float> (model/dsv4/partition.h) initialised exactly as the whole
// model would be (init_dsv4_weights walks the whole model's tensor list, so the same seed gives every tensor the
// same values whatever the split), the step's micro-batches, the loss scale 1/n_micro (the step's loss is the mean
// of the micro-batch losses, as trainer.cpp computes it), and what the trainer needs around it: parameters with
// their optimiser groups, the router-bias buffers and per-block expert loads for the bias update.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/batch.h"
#include "model/dsv4/model.h"
#include "model/dsv4/partition.h"
#include "optim/param.h"
#include "parallel/pipeline_stage.h"
#include "train/dsv4_trainable.h"
#include "train/trainable.h"

namespace trex::train {

class Dsv4Stage : public parallel::PipelineStage {
 public:
  // n_slots: micro-batches this stage holds at once (1F1B: P - stage index; interleaved: more). Micro-batch m uses
  // activation slot m % n_slots; a forward that finds its slot still held by another micro-batch is an error.
  Dsv4Stage(const dsv4::ModelConfig& cfg, const dsv4::ModelPartition& part, const Dsv4TrainOptions& opts,
            uint64_t seed, int64_t n_slots);

  // Replaces the random init by this stage's tensors of a Hugging Face / official checkpoint directory (the other
  // stages' tensors are read and dropped).
  void load_pretrained(const std::filesystem::path& dir);

  // The step's micro-batches (all of one shape), given to every stage before the step; sets the loss scale to
  // 1/batches.size() and clears the step's loss statistics. Fails while a micro-batch is still in flight.
  void set_step_batches(const std::vector<data::Batch>& batches);

  int64_t boundary_elems() const override;  // batch * seq * hc_mult * hidden (needs set_step_batches)
  bool is_first() const override { return model_.partition().embed; }
  bool is_last() const override { return model_.partition().head; }
  double forward(int64_t m, const void* x_in, void* x_out) override;  // fp32 host tensors
  void backward(int64_t m, const void* dx_out, void* dx_in) override;

  // Stable order and pointers, like Dsv4Trainable::params(): tensors (with the design §5 groups), then the router
  // biases of this stage's score-routed blocks as buffers.
  std::vector<optim::ParamRef> params();
  // Tensors also held by another stage (the MTP's copy of embed.weight): the trainer sums their gradients over the
  // holders before the optimiser step; identical updates keep the copies identical.
  std::vector<std::string> shared_params() const { return model_.stage_shared_params(); }
  void zero_grads();  // gradients and the step's expert loads
  void set_controls(const StepControls& c) { model_.set_mtp_weight(c.mtp_weight); }
  // The step so far: loss = sum of this stage's forward returns (its share of the step's mean loss); parts are
  // means over the forwarded micro-batches of this stage's lm / mtp / balance; n_targets the LM targets counted.
  StepStats step_stats() const;
  // Tokens routed to each expert, per local block (model().block_prefix), summed over the step's micro-batches;
  // data parallelism sums them over the DP ranks before after_optimizer_step().
  std::vector<std::vector<int64_t>>& expert_load_sums() { return load_sum_; }
  void after_optimizer_step();  // router bias update of this stage's score-routed blocks
  // The gradient-ready hook of the model (dsv4::GradReadyHook), for overlapping the data-parallel reduction.
  void set_grad_ready_hook(dsv4::GradReadyHook hook) { model_.set_grad_ready_hook(std::move(hook)); }

  dsv4::Model<float>& model() { return model_; }
  const dsv4::Model<float>& model() const { return model_; }

 private:
  int64_t slot_of(int64_t m) const { return m % int64_t(owner_.size()); }
  std::string where() const;

  Dsv4TrainOptions opts_;
  dsv4::Model<float> model_;
  std::vector<data::Batch> batches_;
  std::vector<dsv4::SeqLayout> layouts_;
  double loss_scale_ = 1.0;
  std::vector<int64_t> owner_;  // per slot: the micro-batch in flight there, -1 = free
  std::vector<std::vector<int64_t>> load_sum_;
  double loss_sum_ = 0, lm_sum_ = 0, mtp_sum_ = 0, balance_sum_ = 0;
  int64_t n_forward_ = 0, n_targets_ = 0;
};

}  // namespace trex::train
