// The optimiser of a GPU model (model/cuda/gpu_model.h): its state (AdamW moments, or the Muon momentum in the
// first-moment arena) in the master weights' layout, and the update of the model's fp32 masters and bf16 compute
// copies from its gradients. Under data parallelism (ZeRO-1) each rank updates its own bucket slices and
// all-gathers the updated bf16 slices back, which the model's next forward waits for bucket by bucket; a Muon
// matrix cut between ranks' slices is orthogonalised whole by every rank holding a part of it (its momentum
// updated where it is held, the Newton-Schulz inputs all-gathered: in place under ZeRO-1, into a transient
// buffer of one bucket at a time under ZeRO-2 and ZeRO-3, whose persistent gradients are the slices; under tensor
// parallelism a split matrix's inputs are then gathered whole over TP), each writing its own part (under ZeRO-3
// into its persistent bf16 slice, which the next forward gathers). Frozen tensors (the run's freeze list) are not
// updated, and their moments stay as they are.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "model/cuda/gpu_model.h"
#include "optim/optimizer.h"

namespace trex::dsv4gpu {

class GpuOptimizer {
 public:
  // Allocates zeroed moments for `model` (built with gradients), which must outlive the optimiser.
  explicit GpuOptimizer(GpuModel& model);
  ~GpuOptimizer();
  GpuOptimizer(const GpuOptimizer&) = delete;
  GpuOptimizer& operator=(const GpuOptimizer&) = delete;

  // AdamW with one decay rule on every tensor (the benchmark's torch-AdamW setting).
  void adamw_step(const cuda::AdamWStep& a);
  // One step of the run's optimiser with the CPU's definition (optim::Optimizer, src/optim/optimizer.h): kind
  // "muon" updates the Muon group of optim::dsv4_param_group with Muon (every matrix orthogonalised by batched
  // bf16 Newton-Schulz, kernels/cuda/muon.h; learning rate lr * muon_lr_scale) and the rest with AdamW; kind
  // "adamw" updates everything with AdamW (decay_vectors honoured). step is 1-based (AdamW bias corrections).
  // Gradient clipping is not part of it (as Optimizer::step). Under data parallelism the Muon matrices' gradients
  // are overwritten by their Newton-Schulz inputs (ZeRO-1: all-gathered where a matrix is cut between ranks;
  // ZeRO-2 / 3: the rank's slices only); otherwise
  // gradients are left as they are. grad_scale multiplies every gradient as the update reads it (clipping and
  // 1 / micro-batches folded in; the gradients themselves stay unscaled).
  void step(const optim::OptimizerConfig& c, double lr, int64_t step, float grad_scale = 1.f);

  // Frozen tensors by official name (optim::apply_freeze's group Frozen): step() leaves their weights and moments
  // as they are. zero_frozen_grads() zeroes their gradients (after the step's reductions), so that the clipping
  // norm leaves them out as the CPU optimiser's does.
  void set_frozen(const std::vector<std::string>& names);
  void zero_frozen_grads();

  // State of one parameter (checkpoints; one GPU): which 0 = the AdamW first moment or the Muon momentum, 1 = the
  // AdamW second moment.
  std::vector<float> state(const std::string& name, int which) const;
  void set_state(const std::string& name, int which, const std::vector<float>& v);

  // The moment `which` (0: the AdamW first moment or the Muon momentum, 1: the AdamW second moment) in the master's
  // shard layout (GpuModel::shard_elems() floats on the device): the data-parallel checkpoints read and write it
  // by tensor through GpuModel::gather_shard / set_shard.
  float* moment(int which);
  // Bytes of optimiser state allocated on this rank (both moments, the master's shard layout).
  int64_t state_bytes() const;

  struct Impl;

 private:
  GpuModel& model_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trex::dsv4gpu
