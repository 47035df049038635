// Runs a pipeline schedule (pipeline_schedule.h) over this rank's PipelineStage objects, for every backend: the
// CPU model over MPI (host buffers) and the CUDA model over NCCL (device buffers) walk the same code; what
// differs is the backend's PipelineMemory (pipeline_memory.h) and the communicators each direction uses.
//
// Boundary tensors travel asynchronously: receives are posted where the schedule says (spec.lookahead compute
// actions ahead of the compute that consumes it, so transfers overlap the compute in between; lookahead 0 posts
// each right before its compute), sends are posted right after the compute that produced their tensor and
// complete in the background. Sends from the memory's buffers are reaped as later actions run (the buffer goes
// back to the memory); sends from a stage's own slots (PipelineStage::owned_slots) are ordered before that
// slot's next compute. Every input buffer of a (micro-batch, chunk) lives until that chunk's backward of the
// micro-batch.
//
// Timing: the time a compute action spends waiting for its input is bubble (the schedule's own idle time)
// plus exposed communication. The executor separates them by simulating the schedule with every stage's
// measured forward/backward time (gathered over the pipeline group): the simulated idle time of this rank
// is its bubble, and the rest of the waiting is communication that compute did not hide.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline_memory.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stage.h"

namespace trex::parallel {

struct PipelineStepStats {
  double loss = 0;            // sum of this rank's stage losses over the step's micro-batches
  double step_s = 0;          // wall time of run_step on this rank
  double compute_s = 0;       // forward + backward (host time of the calls: on a device, their launch)
  double wait_s = 0;          // blocked on boundary receives and on the step's last sends
  double bubble_s = 0;        // the schedule's idle time for this rank at the measured stage times
  double exposed_comm_s = 0;  // max(0, wait_s - bubble_s): communication the compute did not hide
  double bubble_fraction = 0; // the simulated step's idle fraction over all ranks
  int max_in_flight = 0;      // most (micro-batch, chunk) pairs with forward done and backward pending
};

// The communicators of the four boundary directions (all over the same pp ranks, rank = pipeline rank). Host
// backends match messages by tag and can use one group for all four. NCCL runs each communicator's operations
// on one serial stream in posting order, so a device pipeline gives each direction its own: activations
// r -> r + 1 (act) and last -> first (act_wrap, interleaved only), gradients r + 1 -> r (grad) and first -> last
// (grad_wrap).
struct PipelineChannels {
  comm::Communicator* act = nullptr;
  comm::Communicator* grad = nullptr;
  comm::Communicator* act_wrap = nullptr;
  comm::Communicator* grad_wrap = nullptr;
  static PipelineChannels one(comm::Communicator& pp) { return {&pp, &pp, &pp, &pp}; }
};

struct PipelineExecutorOptions {
  // Every step, check collectively (a tiny host all-reduce on the activation group) that all stages agree on
  // the boundary size. Needs a communicator that works on host memory.
  bool agree_boundary = true;
  // Message tags within MPI's guaranteed range (pipe_message_tag); NCCL ignores tags and the thread groups
  // take any int.
  bool mpi_tags = true;
};

class PipelineExecutor {
 public:
  // chunks[v] is global stage v * pp + pp_group.rank(); chunks.size() == spec.vpp. The pipeline group's
  // size must be spec.pp. Checks that exactly the first and last global stages say is_first / is_last;
  // every step checks (collectively) that all stages agree on the boundary size, which stages may only
  // know once they have the step's micro-batches. Host memory, one communicator for every direction.
  PipelineExecutor(comm::Communicator& pp_group, const ScheduleSpec& spec, std::vector<PipelineStage*> chunks);
  // Any backend: its memory (not owned, outlives the executor) and one communicator per direction.
  PipelineExecutor(const PipelineChannels& channels, const ScheduleSpec& spec, std::vector<PipelineStage*> chunks,
                   PipelineMemory& memory, const PipelineExecutorOptions& opts = {});
  ~PipelineExecutor();

  // One step: every micro-batch forward and backward through this rank's chunks, in schedule order.
  // Gradients accumulate in the stages. measure_bubble: gather stage times and simulate (a tiny host
  // all-reduce on the activation group); otherwise bubble_s / exposed_comm_s stay 0. before_backward(m, chunk)
  // runs right before each backward (the trainer arms its gradient reducer before the last one);
  // after_forward(m, chunk) right after each forward, before its output is sent.
  PipelineStepStats run_step(bool measure_bubble = true,
                             const std::function<void(int64_t micro, int chunk)>& before_backward = nullptr,
                             const std::function<void(int64_t micro, int chunk)>& after_forward = nullptr);

  const Schedule& schedule() const { return schedule_; }
  int64_t boundary_elems() const { return boundary_; }

 private:
  PipelineExecutor(const PipelineChannels& channels, const ScheduleSpec& spec, std::vector<PipelineStage*> chunks,
                   std::unique_ptr<HostPipelineMemory> own);
  void init();
  void reap_sends(bool wait_all, double* waited);
  void set_boundary();
  // The communicator the tensor entering / leaving global stage s travels on.
  comm::Communicator& act_in(int s) const;
  comm::Communicator& act_out(int s) const;
  comm::Communicator& grad_in(int s) const;
  comm::Communicator& grad_out(int s) const;
  int tag(bool gradient, int to_stage, int64_t micro) const;

  PipelineChannels ch_;
  Schedule schedule_;
  std::vector<PipelineStage*> chunks_;
  std::unique_ptr<HostPipelineMemory> own_memory_;  // the host constructor's
  PipelineMemory& mem_;
  PipelineExecutorOptions opts_;
  int rank_ = 0;
  int64_t boundary_ = -1;
  // Sends from the memory's buffers, reaped when complete.
  struct InFlightSend {
    comm::WorkPtr work;
    BoundaryRole role;
    void* buf;
  };
  std::vector<InFlightSend> sends_;
  // Sends from stages' own slots: [chunk][slot] the last activation / gradient sent out of it.
  std::vector<std::vector<comm::WorkPtr>> slot_act_sends_, slot_grad_sends_;
};

}  // namespace trex::parallel
