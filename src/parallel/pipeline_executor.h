// Runs a pipeline schedule (pipeline_schedule.h) over this rank's PipelineStage objects: boundary tensors
// travel asynchronously on the pipeline group (receives are posted when the schedule says, ahead of the
// compute that consumes them, so transfers overlap the compute in between; sends complete in the
// background and are reaped as later actions run). Every boundary buffer of a (micro-batch, chunk) lives
// until that chunk's backward of the micro-batch, so stages may keep pointers to their inputs.
//
// Timing: the time a compute action spends waiting for its input is bubble (the schedule's own idle time)
// plus exposed communication. The executor separates them by simulating the schedule with every stage's
// measured forward/backward time (gathered over the pipeline group): the simulated idle time of this rank
// is its bubble, and the rest of the waiting is communication that compute did not hide.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stage.h"

namespace trex::parallel {

struct PipelineStepStats {
  double loss = 0;            // sum of this rank's stage losses over the step's micro-batches
  double step_s = 0;          // wall time of run_step on this rank
  double compute_s = 0;       // forward + backward
  double wait_s = 0;          // blocked on boundary receives and on the step's last sends
  double bubble_s = 0;        // the schedule's idle time for this rank at the measured stage times
  double exposed_comm_s = 0;  // max(0, wait_s - bubble_s): communication the compute did not hide
  double bubble_fraction = 0; // the simulated step's idle fraction over all ranks
  int max_in_flight = 0;      // most (micro-batch, chunk) pairs with forward done and backward pending
};

class PipelineExecutor {
 public:
  // chunks[v] is global stage v * pp + pp_group.rank(); chunks.size() == spec.vpp. The pipeline group's
  // size must be spec.pp. Checks that exactly the first and last global stages say is_first / is_last;
  // every step checks (collectively) that all stages agree on the boundary size, which stages may only
  // know once they have the step's micro-batches.
  PipelineExecutor(comm::Communicator& pp_group, const ScheduleSpec& spec, std::vector<PipelineStage*> chunks);

  // One step: every micro-batch forward and backward through this rank's chunks, in schedule order.
  // Gradients accumulate in the stages. measure_bubble: gather stage times and simulate (a tiny
  // all-reduce on the pipeline group); otherwise bubble_s / exposed_comm_s stay 0. before_backward(m, chunk)
  // runs right before each backward (the trainer arms its gradient reducer before the last one).
  PipelineStepStats run_step(bool measure_bubble = true,
                             const std::function<void(int64_t micro, int chunk)>& before_backward = nullptr);

  const Schedule& schedule() const { return schedule_; }
  int64_t boundary_elems() const { return boundary_; }

 private:
  std::vector<float> take_buffer();
  void give_buffer(std::vector<float>&& b);
  void reap_sends(bool wait_all, double* waited);
  void check_boundary();

  comm::Communicator& pp_;
  Schedule schedule_;
  std::vector<PipelineStage*> chunks_;
  int rank_ = 0;
  int64_t boundary_ = 0;
  std::vector<std::vector<float>> pool_;
  struct InFlightSend {
    comm::WorkPtr work;
    std::vector<float> buf;
  };
  std::vector<InFlightSend> sends_;
};

}  // namespace trex::parallel
