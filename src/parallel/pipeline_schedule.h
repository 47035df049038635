// Pipeline schedules as data: for each pipeline rank, the ordered list of actions it performs in one
// training step (forward / backward of micro-batch m on one of its virtual stages, and the posting of
// the boundary sends and receives). Generation is a pure function of (pp, vpp, micro-batches, kind), so
// schedules are unit-tested by simulation before any rank runs one (pipeline_executor.h runs them).
//
// Stages: the model is cut into S = pp * vpp consecutive stages; rank r holds the vpp "chunks"
// r, r + pp, r + 2 pp, ... (Megatron's interleaved assignment), so global stage s = chunk * pp + rank.
//
// Kinds:
//  - 1f1b (PipeDream-flush, vpp = 1): rank r runs min(pp - r - 1, M) warm-up forwards, then alternates
//    one forward / one backward, then drains the remaining backwards. At most pp - r micro-batches are
//    in flight on rank r (forward done, backward not yet).
//  - interleaved (Megatron's virtual pipeline, vpp >= 1, M a multiple of pp): forwards walk the chunks in
//    groups of pp micro-batches, backwards walk them in reverse; rank r warms up with
//    (pp - r - 1) * 2 + (vpp - 1) * pp chunk-forwards, then alternates.
//
// Communication: a receive is posted `lookahead` compute actions before the action that consumes it (so
// the transfer overlaps the compute in between); a send is posted right after the compute that produced
// its tensor. Posting never blocks; a compute action waits for its own receive only.
//
// Bubble: with a forward of t_f and a backward of t_b per micro-batch over the whole rank (t_f / vpp and
// t_b / vpp per chunk) and free communication, the step takes (M + (pp - 1) / vpp) (t_f + t_b), so the
// idle fraction is (pp - 1) / (vpp * M + pp - 1). For 1F1B (vpp = 1) that is (pp - 1) / (M + pp - 1).
// simulate_schedule measures it; the tests hold the generated schedules to that formula.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace trex::parallel {

enum class ScheduleKind { OneFOneB, Interleaved };
std::string schedule_kind_name(ScheduleKind k);              // "1f1b" | "interleaved"
ScheduleKind parse_schedule_kind(const std::string& name);   // throws trex::Error naming the choices

enum class PipeOp : uint8_t { RecvAct, Forward, SendAct, RecvGrad, Backward, SendGrad };
const char* pipe_op_name(PipeOp op);

struct PipeAction {
  PipeOp op = PipeOp::Forward;
  int64_t micro = 0;  // micro-batch, 0-based within the step
  int chunk = 0;      // local virtual stage (0 .. vpp-1); the global stage is chunk * pp + rank
  int peer = -1;      // pipeline rank sent to / received from (-1 for compute)
};

struct ScheduleSpec {
  int pp = 1;
  int vpp = 1;
  int64_t micro_batches = 1;
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int lookahead = 1;  // compute actions between posting a receive and consuming it (0: post just before)
};

struct Schedule {
  ScheduleSpec spec;
  std::vector<std::vector<PipeAction>> ranks;  // [pp] ordered actions
  int n_stages() const { return spec.pp * spec.vpp; }
  int stage_of(int rank, int chunk) const { return chunk * spec.pp + rank; }
  int rank_of(int stage) const { return stage % spec.pp; }
  int chunk_of(int stage) const { return stage / spec.pp; }
};

// Empty when the spec can be scheduled, else why (e.g. "interleaved needs micro_batches (6) to be a
// multiple of pp (4)").
std::string check_schedule_spec(const ScheduleSpec& spec);
// Throws trex::Error with check_schedule_spec's reason for impossible specs.
Schedule make_schedule(const ScheduleSpec& spec);

// The message tag of the boundary tensor of micro-batch m entering global stage `to_stage` (activations)
// or leaving it backwards (gradients): unique within a step, so sends and receives match regardless of
// posting order. mpi_range: throws when the step has too many messages for MPI's guaranteed tag range (32767);
// off for communicators without that limit (NCCL ignores tags, the thread groups take any int).
int pipe_message_tag(const ScheduleSpec& spec, bool gradient, int to_stage, int64_t micro, bool mpi_range = true);

struct SimOptions {
  // Per global stage durations (size pp * vpp), or empty for 1 / vpp (forward) and 2 / vpp (backward).
  std::vector<double> t_fwd, t_bwd;
  double latency = 0;  // from posting a send to the data being usable by the receiver
};

struct SimResult {
  std::string error;                // empty when the schedule ran to completion and every check held
  double makespan = 0;              // step time
  std::vector<double> busy;         // [pp] compute time per rank
  std::vector<double> finish;       // [pp] time of each rank's last action
  std::vector<int> max_in_flight;   // [pp] most micro-batch chunks with forward done and backward pending
  double bubble_fraction = 0;       // 1 - sum(busy) / (pp * makespan)
  bool ok() const { return error.empty(); }
};

// Executes the schedule as the executor would (posting is instant, compute waits for its receive, which
// completes `latency` after the matching send is posted) and checks it: every (micro-batch, stage) has
// exactly one forward and one backward on the right rank, forward before backward, every receive is
// posted before its consumer and matched by exactly one send from the right peer, no send before its
// tensor exists, and no deadlock (otherwise the error names each blocked rank and action).
SimResult simulate_schedule(const Schedule& s, const SimOptions& opts = {});

std::string describe_actions(const std::vector<PipeAction>& actions);  // "F0.0 B0.0 ..." for messages

}  // namespace trex::parallel
