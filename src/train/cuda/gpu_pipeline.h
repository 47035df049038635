// Pipeline parallelism for the GPU model: one process per stage (a GpuModel built on a layer range), the 1F1B
// schedule (PipeDream-flush: rank r of P runs min(P - 1 - r, M) warm-up forwards, then one forward / one
// backward, then the remaining backwards), boundary streams [tokens, hc, d] sent with NCCL point-to-point.
//
// Two communicators over the same ranks (rank = stage), one per direction: each direction's transfers then run
// on their own NCCL stream in micro-batch order, so an early-posted receive of one direction can never block a
// send of the other (one serial stream would deadlock: rank 0 sends A1 while rank 1 sends G0). Activations go
// as bf16 (what the next stage's kernels read), gradients as fp32 (what the previous stage accumulates in), so a
// pipeline step computes exactly what one GPU accumulating the same micro-batches does.
//
// A receive is posted right before the compute that needs it and waited for on the host (with the communicator's
// timeout: a dead peer is an error, not a hang): posting earlier deadlocks when the next compute synchronises the
// device while the receive kernel spins (see step()). Sends are posted right after their compute and overlap
// the next one; a slot's buffers are reused only after its sends have left.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/dsv4/seq_layout.h"
#include "model/cuda/gpu_model.h"

namespace trex::dsv4gpu {

struct PipelineStats {
  double fwd_ms = 0, bwd_ms = 0;  // device time of this stage's forwards / backwards (CUDA events)
  double recv_wait_ms = 0;        // host blocked on incoming boundary tensors (bubble + exposed transfer)
  int64_t steps = 0;
};

class GpuPipeline {
 public:
  // stage: this rank's GpuModel (layer range = stage `act.rank()`, stage_slots >= P - rank). act / grad: two
  // NCCL communicators over the P pipeline ranks (e.g. two splits of the world). Not owned.
  GpuPipeline(GpuModel& stage, comm::Communicator& act, comm::Communicator& grad, int64_t micro_batches);
  ~GpuPipeline();
  GpuPipeline(const GpuPipeline&) = delete;
  GpuPipeline& operator=(const GpuPipeline&) = delete;

  // Forward + backward of one step over the micro-batches: ids / labels [M * layout.B, layout.T] on the host
  // (micro-batch m is rows [m B, (m + 1) B), each with `layout`); gradients accumulate into the stage's (call
  // zero_grads before). Returns the step's mean loss on the last stage; the others return their layers' balance
  // terms (0 without the balance loss), so the step's loss is the sum over the stages (global_losses).
  // With a DP group on the stage (GpuModelOptions::dp): ids / labels are this DP rank's micro-batches, the loss
  // normaliser counts every DP rank's targets, the returned loss is this rank's share (summed over the DP ranks
  // it is the step's), and the gradients are reduce-scattered over DP in the last micro-batch's backward.
  double step(const int32_t* ids, const int32_t* labels, const dsv4::SeqLayout& layout);
  // The same over micro-batches that each have their own layout (packed documents: the Trainer's batches; every
  // one the same token count, the boundary size) and their own loss normaliser (the last stage's head divides the
  // micro-batch's CE sum by it; e.g. its own labelled targets x the step's micro-batches for a mean of micro-batch
  // means). step_micro_batches: the micro-batches the step's loss is the mean of (GpuModel::begin_step). The
  // normalisers are used as given (the caller sums them over DP when it wants a DP-wide mean).
  struct MicroBatch {
    const int32_t* ids = nullptr;
    const int32_t* labels = nullptr;
    const dsv4::SeqLayout* layout = nullptr;
    int64_t normaliser = 0;
    int64_t mtp_normaliser = -1;  // the MTP head's, likewise (needed when the stages have the MTP module)
  };
  // after_forward(m), when given, runs right after micro-batch m's forward on this stage, while its slot still
  // holds what the forward saved (e.g. its router selections: a slot is reused by a later forward of the step).
  double step(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
              const std::function<void(int64_t)>& after_forward = {});
  // The stages' loss values summed over the pipeline group (every rank gets them; the last stage's CE and every
  // stage's balance terms): call it outside the timed loop, it synchronises the ranks.
  std::vector<double> global_losses(const std::vector<double>& local);

  // Milliseconds since the last reset (synchronises).
  PipelineStats stats();
  void reset_stats();
  int rank() const { return rank_; }
  int stages() const { return P_; }

  // The 1F1B compute order of rank r of P over M micro-batches (parallel::make_schedule's): +(m+1) = forward of
  // m, -(m+1) = backward of m.
  static std::vector<int64_t> one_f_one_b(int r, int P, int64_t M);

 private:
  double run(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
             const std::function<void(int64_t)>& after_forward);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, P_ = 1;
};

}  // namespace trex::dsv4gpu
