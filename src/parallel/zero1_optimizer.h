// Data parallelism with a ZeRO-1 sharded optimiser (AdamW and Muon). Every rank holds the whole model
// and its own gradients; each trainable tensor has one owner rank that keeps its optimiser state and
// updates it (whole matrices, so Muon orthogonalises the true matrix, design §5).
//
// One step on every rank of the data-parallel group:
//   model.zero_grads(); forward/backward of the micro-batches (gradients accumulate locally)
//   zero.begin_grad_sync(1.0 / grad_accum);      // before the last micro-batch's backward
//   ... the model's gradient-ready hook calls zero.on_grads_ready(names) during that backward: each
//       bucket's reduce_scatter starts as soon as all its tensors are ready, overlapping the rest ...
//   zero.finish_grad_sync();                     // starts what is left, waits
//   zero.clip_gradients();                       // global norm over all owners (collective)
//   zero.step(lr);                               // owners update, parameters all-gathered (collective)
//   all_reduce_expert_loads(*mesh.dp_group, ...) before the router-bias update (after_optimizer_step)
// Without a hook, begin + finish after the last backward give the same result with no overlap.
//
// Reduced gradient = grad_scale x mean over the DP ranks, so DP = n with grad_accum = a matches one
// process with grad_accum = n x a. Expert tensors (names with ".ffn.experts.") are reduced and owned
// within the expert-data-parallel group (the ranks holding the same expert shard), dense tensors within
// the DP group; both are divided by the DP size, since every DP rank's loss reaches the experts through
// the EP exchange. Buffers (router bias) and frozen tensors are never reduced or optimised.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "parallel/grad_reducer.h"
#include "parallel/mesh.h"

namespace trex::parallel {

struct Zero1Options {
  int64_t bucket_elems = int64_t(1) << 25;  // target elements per bucket (all ranks' parts together)
};

bool is_expert_param(std::string_view name);  // a routed expert's tensor: reduced over the EDP group

class Zero1Optimizer {
 public:
  // params: the model's table in model order (apply_freeze first); gradients are assumed ready in the
  // reverse of that order (backward), which sets the buckets. pp_group (may be null) is summed over for
  // the global gradient norm when pipeline stages hold different tensors. The groups must outlive this.
  Zero1Optimizer(std::vector<optim::ParamRef> params, const optim::OptimizerConfig& cfg,
                 comm::Communicator& dp_group, comm::Communicator& edp_group, comm::Communicator* pp_group = nullptr,
                 Zero1Options opts = {});
  Zero1Optimizer(std::vector<optim::ParamRef> params, const optim::OptimizerConfig& cfg, Mesh& mesh,
                 Zero1Options opts = {});

  // Gradient synchronisation of one step (see the top of the file).
  void begin_grad_sync(double grad_scale = 1.0);
  void on_grads_ready(const std::vector<std::string>& names);  // ignored outside begin..finish
  void finish_grad_sync();

  // Global L2 norm of the reduced gradients (before clipping); collective over DP (and PP).
  double grad_norm();
  // Scales the owned gradients so the global norm is at most clip_grad_norm; returns the norm before.
  double clip_gradients();
  // Owners update their tensors with learning rate lr, then every bucket's values are all-gathered
  // (bucket k+1 is updated while bucket k's gather is in flight). Collective.
  void step(double lr);

  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t s);
  // The optimiser state this rank owns, by "<param>.exp_avg" / ".exp_avg_sq" / ".momentum".
  std::vector<optim::StateTensor> state_tensors();
  const std::vector<optim::ParamRef>& params() const { return params_; }
  const optim::OptimizerConfig& config() const { return cfg_; }

  // Ownership by name: the owner's rank within the tensor's group (dp_group, or edp_group for experts),
  // -1 for tensors that are not optimised (buffers, frozen).
  int owner_of(const std::string& name) const;
  bool owns(const std::string& name) const;
  // The reduced (and, after clip_gradients, clipped) gradient of an owned tensor; null when not owned.
  const float* reduced_grad(const std::string& name) const;
  const GradReducer& dense() const { return *reducer_[0]; }
  const GradReducer& experts() const { return *reducer_[1]; }
  int buckets_started() const { return reducer_[0]->buckets_started() + reducer_[1]->buckets_started(); }
  int n_buckets() const { return reducer_[0]->n_buckets() + reducer_[1]->n_buckets(); }

 private:
  std::vector<optim::ParamRef> params_;
  optim::OptimizerConfig cfg_;
  comm::Communicator& dp_;
  comm::Communicator* pp_;
  std::unique_ptr<GradReducer> reducer_[2];  // 0: dense over DP, 1: experts over EDP
  // One optimiser per (group, bucket) over the owned tensors, so buckets update and gather in turn.
  struct Part {
    int group, bucket;
    std::unique_ptr<optim::Optimizer> opt;
  };
  std::vector<Part> parts_;
  std::map<std::string, std::pair<int, int>> index_;  // name -> (group, tensor index); group -1: not optimised
  int64_t step_ = 0;
};

// Sums per-layer expert loads (tokens routed to each expert) over the DP group in place, so the router-
// bias update of every rank sees the global batch's loads (and stays identical across ranks).
void all_reduce_expert_loads(comm::Communicator& dp_group, std::vector<std::vector<int64_t>>& loads);

}  // namespace trex::parallel
