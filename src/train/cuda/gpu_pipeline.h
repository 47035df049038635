// Pipeline parallelism for the GPU model: one process per stage (a GpuModel built on a layer range), the 1F1B
// schedule (PipeDream-flush: rank r of P runs min(P - 1 - r, M) warm-up forwards, then one forward / one
// backward, then the remaining backwards), boundary streams [tokens, hc, d] sent with NCCL point-to-point.
//
// Interleaved stages (vpp = V > 1): the rank holds V chunks, one GpuModel each (chunk c of rank r is virtual stage
// c P + r, parallel/pipeline_schedule.h), and walks parallel::make_schedule's interleaved order (the CPU
// trainer's). Virtual stage g sends its output to g + 1: rank r -> r + 1 on `act`, and the last rank's chunk c to
// rank 0's chunk c + 1 on a third communicator (`act_wrap`); gradients back the same way (`grad`, `grad_wrap`).
// Every communicator then carries one direction between one pair order, so no rank's serial NCCL stream holds a
// send behind a receive that the ring closes on. Messages are tagged by (direction, virtual stage, micro-batch).
//
// Two communicators over the same ranks (rank = stage), one per direction: each direction's transfers then run
// on their own NCCL stream in micro-batch order, so an early-posted receive of one direction can never block a
// send of the other (one serial stream would deadlock: rank 0 sends A1 while rank 1 sends G0). Activations go
// as bf16 (what the next stage's kernels read), gradients as fp32 (what the previous stage accumulates in), so a
// pipeline step computes exactly what one GPU accumulating the same micro-batches does.
//
// A receive is posted right before the compute that needs it and waited for on the host (with the communicator's
// timeout: a dead peer is an error, not a hang): posting earlier deadlocks when the next compute synchronises the
// device while the receive kernel spins (schedule lookahead 0). Sends are posted right after their compute and
// overlap the next one; a slot's buffers are reused only after its sends have left (a stream wait).
//
// The walking of the schedule and that bookkeeping are parallel::PipelineExecutor's, the CPU trainer's executor;
// this class gives it the device memory (parallel::PipelineMemory: bf16 / fp32 boundary buffers, stream waits,
// CUDA-event timing) and the GpuModel chunks as stages that send from their own slots.
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
  // Interleaved: chunks[c] is virtual stage c P + rank (V = chunks.size(), each with stage_slots >= chunk_slots'
  // entry c); micro_batches a multiple of P when V > 1 (make_schedule refuses the others). act_wrap / grad_wrap:
  // two more communicators over the same P ranks (the last -> first hop of the activations, first -> last of the
  // gradients); needed when V > 1, ignored otherwise. Not owned.
  GpuPipeline(std::vector<GpuModel*> chunks, comm::Communicator& act, comm::Communicator& grad,
              comm::Communicator* act_wrap, comm::Communicator* grad_wrap, int64_t micro_batches);
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
  // The same with interleaved chunks: after_chunk_forward(m, c) right after micro-batch m's forward on chunk c.
  double step_chunks(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
                     const std::function<void(int64_t, int)>& after_chunk_forward);
  // The stages' loss values summed over the pipeline group (every rank gets them; the last stage's CE and every
  // stage's balance terms): call it outside the timed loop, it synchronises the ranks.
  std::vector<double> global_losses(const std::vector<double>& local);

  // Milliseconds since the last reset (synchronises).
  PipelineStats stats();
  void reset_stats();
  int rank() const { return rank_; }
  int stages() const { return P_; }
  int chunks() const { return V_; }

  // The 1F1B compute order of rank r of P over M micro-batches (parallel::make_schedule's): +(m+1) = forward of
  // m, -(m+1) = backward of m.
  static std::vector<int64_t> one_f_one_b(int r, int P, int64_t M);
  // The compute order of rank r with V chunks (V = 1: 1F1B, else the interleaved schedule): per action the chunk,
  // the micro-batch and forward / backward.
  struct ComputeOp {
    bool forward = true;
    int chunk = 0;
    int64_t micro = 0;
  };
  static std::vector<ComputeOp> compute_order(int r, int P, int V, int64_t M);
  // The most micro-batches each of rank r's chunks holds at once under that order: the stage_slots its GpuModel
  // needs (1F1B: min(P - r, M)).
  static std::vector<int> chunk_slots(int r, int P, int V, int64_t M);

 private:
  double run(const std::vector<MicroBatch>& micro, int64_t step_micro_batches,
             const std::function<void(int64_t, int)>& after_forward);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, P_ = 1, V_ = 1;
};

}  // namespace trex::dsv4gpu
