// DeepSeek-V4 (src/model/dsv4) behind the Trainable interface: parameters by official name with the
// design §5 optimiser groups, router biases as checkpointed buffers updated after every step by the
// auxiliary-loss-free rule (b += speed * sign(mean load - load), loads summed over the step's
// micro-batches), packed-document layout from the batch, MTP weight from the schedule.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "model/dsv4/model.h"
#include "model/dsv4/recompute.h"
#include "train/trainable.h"

namespace trex::train {

struct Dsv4TrainOptions {
  double init_std = 0.02;
  double bias_update_speed = 1e-3;  // gamma_b (design §5); 0 disables the update
  bool deterministic = false;       // GPU: bitwise reproducible backward (train.deterministic)
  dsv4::ModelOptions model;
  // The GPU trainers' activation recomputation (TrainConfig::recompute); the CPU model runs none only.
  dsv4::Recompute recompute = dsv4::Recompute::None;
  int64_t recompute_full_layers = -1;  // TrainConfig::recompute_full_layers
};

class Dsv4Trainable : public Trainable {
 public:
  Dsv4Trainable(const dsv4::ModelConfig& cfg, const Dsv4TrainOptions& opts, uint64_t seed);
  // Replaces the random init by a Hugging Face / official checkpoint directory (src/model/dsv4/checkpoint.h).
  void load_pretrained(const std::filesystem::path& dir);

  std::vector<optim::ParamRef> params() override;
  void zero_grads() override;
  StepStats forward_backward(const data::Batch& batch) override;
  void set_controls(const StepControls& c) override;
  void after_optimizer_step() override;
  double flops_per_token(int64_t seq_len) const override;
  std::string describe() const override;

  dsv4::Model<float>& model() { return *model_; }
  // Tokens routed to each expert, per block, summed over the step's micro-batches; data parallelism sums
  // them over the DP ranks (parallel::all_reduce_expert_loads) before after_optimizer_step().
  std::vector<std::vector<int64_t>>& expert_load_sums() { return load_sum_; }

 private:
  void init_weights(uint64_t seed);
  dsv4::ModelConfig cfg_;
  Dsv4TrainOptions opts_;
  std::unique_ptr<dsv4::Model<float>> model_;
  std::vector<std::vector<int64_t>> load_sum_;  // per block, summed over the step's micro-batches
};

// Design §5 initialisation of the tensors and buffers `table` holds, `table` being the whole model's or one
// stage's (Model with a ModelPartition): it walks the WHOLE model's tensor list in declaration order with one
// random stream, skipping what the table lacks, so every partition gets the values the whole model gets.
void init_dsv4_weights(dsv4::ParamTable<float>& table, const dsv4::ModelConfig& cfg, const dsv4::ModelOptions& mopts,
                       double init_std, uint64_t seed);
// The packed-document layout of a batch (positions and row-local document starts from its flags).
dsv4::SeqLayout batch_layout(const data::Batch& b);
// The trainer's view of a DeepSeek-V4 parameter table (a whole model or a stage's part): every tensor with its
// optimiser group (optim::dsv4_param_group), then the router biases as buffers.
std::vector<optim::ParamRef> dsv4_param_refs(dsv4::ParamTable<float>& table);

// The ../shared/bench convention (model_flops.py): 3 x forward matmul FLOPs of the weights one token
// touches (activated experts only, LM head included) + core attention over the keys each position sees.
double dsv4_flops_per_token(const dsv4::ModelConfig& cfg, int64_t seq_len);
// The same convention for one pipeline stage's share: main layers [layer_begin, layer_end), plus hc_head and the LM
// head when `head` (the embedding has no matmul). The stages of a partition sum to dsv4_flops_per_token.
double dsv4_stage_flops_per_token(const dsv4::ModelConfig& cfg, int64_t seq_len, int64_t layer_begin,
                                  int64_t layer_end, bool head);

}  // namespace trex::train
