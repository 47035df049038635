#include "parallel/pipeline_executor.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"

namespace trex::parallel {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

PipelineExecutor::PipelineExecutor(comm::Communicator& pp_group, const ScheduleSpec& spec,
                                   std::vector<PipelineStage*> chunks)
    : pp_(pp_group), schedule_(make_schedule(spec)), chunks_(std::move(chunks)), rank_(pp_group.rank()) {
  TREX_CHECK(pp_.size() == spec.pp, "pipeline executor: the pipeline group has {} ranks, the schedule pp={}",
             pp_.size(), spec.pp);
  TREX_CHECK(int(chunks_.size()) == spec.vpp, "pipeline executor: rank {} has {} stages, the schedule vpp={}", rank_,
             chunks_.size(), spec.vpp);
  const int S = schedule_.n_stages();
  for (int v = 0; v < spec.vpp; ++v) {
    PipelineStage* c = chunks_[size_t(v)];
    TREX_CHECK(c != nullptr, "pipeline executor: rank {} chunk {} is null", rank_, v);
    const int s = schedule_.stage_of(rank_, v);
    TREX_CHECK(c->is_first() == (s == 0) && c->is_last() == (s == S - 1),
               "pipeline executor: rank {} chunk {} is global stage {} of {}, but says is_first={} is_last={}", rank_,
               v, s, S, c->is_first(), c->is_last());
  }
}

void PipelineExecutor::check_boundary() {
  int64_t b = 0;
  for (int v = 0; v < int(chunks_.size()); ++v) {
    const int64_t e = chunks_[size_t(v)]->boundary_elems();
    TREX_CHECK(v == 0 || e == b, "pipeline executor: rank {} chunk {} has a boundary of {} elements, chunk 0 has {}",
               rank_, v, e, b);
    b = e;
  }
  TREX_CHECK(b > 0 || schedule_.n_stages() == 1, "pipeline executor: rank {}: boundary tensor of {} elements", rank_,
             b);
  // Every rank must agree, or a receive would read past a shorter send.
  int64_t mm[2] = {b, -b};
  pp_.all_reduce(mm, 2, comm::ElemType::I64, comm::ReduceOp::Max)->wait();
  TREX_CHECK(mm[0] == -mm[1],
             "pipeline executor: stages disagree on the boundary size: rank {} has {} elements, another rank has {}",
             rank_, b, mm[0] == b ? -mm[1] : mm[0]);
  if (b != boundary_) pool_.clear();  // buffers of the old size
  boundary_ = b;
}

std::vector<float> PipelineExecutor::take_buffer() {
  if (pool_.empty()) return std::vector<float>(size_t(boundary_));
  std::vector<float> b = std::move(pool_.back());
  pool_.pop_back();
  return b;
}

void PipelineExecutor::give_buffer(std::vector<float>&& b) {
  if (!b.empty()) pool_.push_back(std::move(b));
}

void PipelineExecutor::reap_sends(bool wait_all, double* waited) {
  size_t keep = 0;
  for (size_t i = 0; i < sends_.size(); ++i) {
    bool done;
    if (wait_all) {
      const auto t0 = Clock::now();
      sends_[i].work->wait();
      if (waited) *waited += since(t0);
      done = true;
    } else {
      done = sends_[i].work->test();
    }
    if (done) {
      give_buffer(std::move(sends_[i].buf));
    } else {
      // Never self-move: a self-move-assigned vector frees its data while the send still reads it.
      if (keep != i) sends_[keep] = std::move(sends_[i]);
      ++keep;
    }
  }
  sends_.resize(keep);
}

PipelineStepStats PipelineExecutor::run_step(bool measure_bubble,
                                             const std::function<void(int64_t, int)>& before_backward) {
  const ScheduleSpec& spec = schedule_.spec;
  const int S = schedule_.n_stages(), V = spec.vpp;
  const auto t_step = Clock::now();
  check_boundary();  // stages know their boundary once they have the step's micro-batches
  PipelineStepStats st;
  struct Slot {
    std::vector<float> x_in, x_out, dx_out, dx_in;
    comm::WorkPtr recv_act, recv_grad;
  };
  std::map<std::pair<int64_t, int>, Slot> slots;  // (micro, chunk)
  std::vector<double> t_fwd(size_t(S), 0.0), t_bwd(size_t(S), 0.0);
  int in_flight = 0;
  const size_t bytes = size_t(boundary_) * sizeof(float);

  for (const PipeAction& a : schedule_.ranks[size_t(rank_)]) {
    const int s = schedule_.stage_of(rank_, a.chunk);
    Slot& sl = slots[{a.micro, a.chunk}];
    PipelineStage& stage = *chunks_[size_t(a.chunk)];
    switch (a.op) {
      case PipeOp::RecvAct:
        sl.x_in = take_buffer();
        sl.recv_act = pp_.recv(sl.x_in.data(), bytes, a.peer, pipe_message_tag(spec, false, s, a.micro));
        break;
      case PipeOp::RecvGrad:
        sl.dx_out = take_buffer();
        sl.recv_grad = pp_.recv(sl.dx_out.data(), bytes, a.peer, pipe_message_tag(spec, true, s, a.micro));
        break;
      case PipeOp::Forward: {
        if (sl.recv_act) {
          const auto t0 = Clock::now();
          sl.recv_act->wait();
          st.wait_s += since(t0);
          sl.recv_act.reset();
        }
        TREX_CHECK(s == 0 || !sl.x_in.empty(), "pipeline: rank {} stage {} micro-batch {}: no activation received",
                   rank_, s, a.micro);
        if (s < S - 1) sl.x_out = take_buffer();
        const auto t0 = Clock::now();
        st.loss += stage.forward(a.micro, s == 0 ? nullptr : sl.x_in.data(), s < S - 1 ? sl.x_out.data() : nullptr);
        const double dt = since(t0);
        st.compute_s += dt;
        t_fwd[size_t(s)] += dt;
        st.max_in_flight = std::max(st.max_in_flight, ++in_flight);
        break;
      }
      case PipeOp::SendAct:
        sends_.push_back({pp_.send(sl.x_out.data(), bytes, a.peer, pipe_message_tag(spec, false, s + 1, a.micro)),
                          std::move(sl.x_out)});
        sl.x_out.clear();
        break;
      case PipeOp::Backward: {
        if (sl.recv_grad) {
          const auto t0 = Clock::now();
          sl.recv_grad->wait();
          st.wait_s += since(t0);
          sl.recv_grad.reset();
        }
        TREX_CHECK(s == S - 1 || !sl.dx_out.empty(),
                   "pipeline: rank {} stage {} micro-batch {}: no gradient received", rank_, s, a.micro);
        if (s > 0) sl.dx_in = take_buffer();
        if (before_backward) before_backward(a.micro, a.chunk);
        const auto t0 = Clock::now();
        stage.backward(a.micro, s < S - 1 ? sl.dx_out.data() : nullptr, s > 0 ? sl.dx_in.data() : nullptr);
        const double dt = since(t0);
        st.compute_s += dt;
        t_bwd[size_t(s)] += dt;
        --in_flight;
        give_buffer(std::move(sl.x_in));
        give_buffer(std::move(sl.dx_out));
        if (s == 0) slots.erase({a.micro, a.chunk});
        break;
      }
      case PipeOp::SendGrad:
        sends_.push_back({pp_.send(sl.dx_in.data(), bytes, a.peer, pipe_message_tag(spec, true, s - 1, a.micro)),
                          std::move(sl.dx_in)});
        slots.erase({a.micro, a.chunk});
        break;
    }
    reap_sends(false, nullptr);
  }
  reap_sends(true, &st.wait_s);
  TREX_ASSERT(in_flight == 0);
  st.step_s = since(t_step);

  if (measure_bubble) {
    // Per-stage mean times, summed over the group (each stage is timed by exactly one rank).
    std::vector<double> times(size_t(2 * S), 0.0);
    for (int v = 0; v < V; ++v) {
      const int s = schedule_.stage_of(rank_, v);
      times[size_t(s)] = t_fwd[size_t(s)] / double(spec.micro_batches);
      times[size_t(S + s)] = t_bwd[size_t(s)] / double(spec.micro_batches);
    }
    pp_.all_reduce(times.data(), times.size(), comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
    SimOptions so;
    so.t_fwd.assign(times.begin(), times.begin() + S);
    so.t_bwd.assign(times.begin() + S, times.end());
    SimResult sim = simulate_schedule(schedule_, so);
    TREX_ASSERT(sim.ok());
    st.bubble_s = sim.makespan - sim.busy[size_t(rank_)];
    st.bubble_fraction = sim.bubble_fraction;
    st.exposed_comm_s = std::max(0.0, st.wait_s - st.bubble_s);
  }
  return st;
}

}  // namespace trex::parallel
