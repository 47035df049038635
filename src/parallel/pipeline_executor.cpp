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
    : PipelineExecutor(PipelineChannels::one(pp_group), spec, std::move(chunks),
                       std::make_unique<HostPipelineMemory>()) {}

PipelineExecutor::PipelineExecutor(const PipelineChannels& channels, const ScheduleSpec& spec,
                                   std::vector<PipelineStage*> chunks, std::unique_ptr<HostPipelineMemory> own)
    : ch_(channels), schedule_(make_schedule(spec)), chunks_(std::move(chunks)), own_memory_(std::move(own)),
      mem_(*own_memory_) {
  init();
}

PipelineExecutor::PipelineExecutor(const PipelineChannels& channels, const ScheduleSpec& spec,
                                   std::vector<PipelineStage*> chunks, PipelineMemory& memory,
                                   const PipelineExecutorOptions& opts)
    : ch_(channels), schedule_(make_schedule(spec)), chunks_(std::move(chunks)), mem_(memory), opts_(opts) {
  init();
}

void PipelineExecutor::init() {
  const ScheduleSpec& spec = schedule_.spec;
  TREX_CHECK(ch_.act && ch_.grad, "pipeline executor: no activation or gradient communicator");
  rank_ = ch_.act->rank();
  TREX_CHECK(ch_.act->size() == spec.pp, "pipeline executor: the pipeline group has {} ranks, the schedule pp={}",
             ch_.act->size(), spec.pp);
  for (comm::Communicator* c : {ch_.grad, ch_.act_wrap, ch_.grad_wrap})
    TREX_CHECK(!c || (c->size() == spec.pp && c->rank() == rank_),
               "pipeline executor: rank {}: a boundary communicator has size {} / rank {}, the activation group {} / "
               "{}", rank_, c->size(), c->rank(), spec.pp, rank_);
  TREX_CHECK(spec.vpp == 1 || (ch_.act_wrap && ch_.grad_wrap),
             "pipeline executor: rank {}: {} interleaved chunks need the wrap communicators (last rank -> rank 0 "
             "activations, rank 0 -> last rank gradients)", rank_, spec.vpp);
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
    TREX_CHECK(c->owned_slots() >= 0, "pipeline executor: rank {} chunk {} owns {} slots", rank_, v,
               c->owned_slots());
    slot_act_sends_.emplace_back(size_t(c->owned_slots()));
    slot_grad_sends_.emplace_back(size_t(c->owned_slots()));
  }
}

PipelineExecutor::~PipelineExecutor() = default;

comm::Communicator& PipelineExecutor::act_in(int s) const {
  return schedule_.rank_of(s) > 0 ? *ch_.act : *ch_.act_wrap;
}
comm::Communicator& PipelineExecutor::act_out(int s) const {
  return schedule_.rank_of(s) < schedule_.spec.pp - 1 ? *ch_.act : *ch_.act_wrap;
}
comm::Communicator& PipelineExecutor::grad_in(int s) const {
  return schedule_.rank_of(s) < schedule_.spec.pp - 1 ? *ch_.grad : *ch_.grad_wrap;
}
comm::Communicator& PipelineExecutor::grad_out(int s) const {
  return schedule_.rank_of(s) > 0 ? *ch_.grad : *ch_.grad_wrap;
}

int PipelineExecutor::tag(bool gradient, int to_stage, int64_t micro) const {
  return pipe_message_tag(schedule_.spec, gradient, to_stage, micro, opts_.mpi_tags);
}

void PipelineExecutor::set_boundary() {
  int64_t b = 0;
  for (int v = 0; v < int(chunks_.size()); ++v) {
    const int64_t e = chunks_[size_t(v)]->boundary_elems();
    TREX_CHECK(v == 0 || e == b, "pipeline executor: rank {} chunk {} has a boundary of {} elements, chunk 0 has {}",
               rank_, v, e, b);
    b = e;
  }
  TREX_CHECK(b > 0 || schedule_.n_stages() == 1, "pipeline executor: rank {}: boundary tensor of {} elements", rank_,
             b);
  if (opts_.agree_boundary) {
    // Every rank must agree, or a receive would read past a shorter send.
    int64_t mm[2] = {b, -b};
    ch_.act->all_reduce(mm, 2, comm::ElemType::I64, comm::ReduceOp::Max)->wait();
    TREX_CHECK(mm[0] == -mm[1],
               "pipeline executor: stages disagree on the boundary size: rank {} has {} elements, another rank has {}",
               rank_, b, mm[0] == b ? -mm[1] : mm[0]);
  }
  if (b != boundary_) mem_.resize(b);  // nothing is in flight between steps
  boundary_ = b;
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
      mem_.give(sends_[i].role, sends_[i].buf);
    } else {
      if (keep != i) sends_[keep] = std::move(sends_[i]);
      ++keep;
    }
  }
  sends_.resize(keep);
}

PipelineStepStats PipelineExecutor::run_step(bool measure_bubble,
                                             const std::function<void(int64_t, int)>& before_backward,
                                             const std::function<void(int64_t, int)>& after_forward) {
  const ScheduleSpec& spec = schedule_.spec;
  const int S = schedule_.n_stages(), V = spec.vpp;
  const auto t_step = Clock::now();
  set_boundary();  // stages know their boundary once they have the step's micro-batches
  PipelineStepStats st;
  struct Slot {
    void *x_in = nullptr, *x_out = nullptr, *dx_out = nullptr, *dx_in = nullptr;
    comm::WorkPtr recv_act, recv_grad;
  };
  std::map<std::pair<int64_t, int>, Slot> slots;  // (micro, chunk)
  std::vector<double> t_fwd(size_t(S), 0.0), t_bwd(size_t(S), 0.0);
  int in_flight = 0;
  const size_t act_bytes = size_t(boundary_) * mem_.act_elem_bytes();
  const size_t grad_bytes = size_t(boundary_) * mem_.grad_elem_bytes();
  // A receive the compute is about to read: the host waits (with the communicator's timeout, so a lost peer is
  // an error naming the rank and transfer), then the backend orders the compute after it.
  auto wait_recv = [&](comm::WorkPtr& w) {
    if (!w) return;
    const auto t0 = Clock::now();
    w->wait();
    st.wait_s += since(t0);
    mem_.after_receive(*w);
    w.reset();
  };
  auto before_reuse = [&](comm::WorkPtr& w) {
    if (!w) return;
    mem_.before_reuse(*w);
    w.reset();
  };

  for (const PipeAction& a : schedule_.ranks[size_t(rank_)]) {
    const int s = schedule_.stage_of(rank_, a.chunk);
    Slot& sl = slots[{a.micro, a.chunk}];
    PipelineStage& stage = *chunks_[size_t(a.chunk)];
    const int owned = stage.owned_slots();
    const size_t slot = owned > 0 ? size_t(a.micro % owned) : 0;
    switch (a.op) {
      case PipeOp::RecvAct:
        sl.x_in = mem_.take(BoundaryRole::ActIn);
        sl.recv_act = act_in(s).recv(sl.x_in, act_bytes, a.peer, tag(false, s, a.micro));
        break;
      case PipeOp::RecvGrad:
        sl.dx_out = mem_.take(BoundaryRole::GradIn);
        sl.recv_grad = grad_in(s).recv(sl.dx_out, grad_bytes, a.peer, tag(true, s, a.micro));
        break;
      case PipeOp::Forward: {
        wait_recv(sl.recv_act);
        TREX_CHECK(s == 0 || sl.x_in, "pipeline: rank {} stage {} micro-batch {}: no activation received", rank_, s,
                   a.micro);
        if (owned > 0) before_reuse(slot_act_sends_[size_t(a.chunk)][slot]);  // the slot's previous output left
        else if (s < S - 1) sl.x_out = mem_.take(BoundaryRole::ActOut);
        mem_.compute_begin(s, false);
        const auto t0 = Clock::now();
        st.loss += stage.forward(a.micro, s == 0 ? nullptr : sl.x_in, sl.x_out);
        const double dt = since(t0);
        mem_.compute_end(s, false);
        st.compute_s += dt;
        t_fwd[size_t(s)] += dt;
        st.max_in_flight = std::max(st.max_in_flight, ++in_flight);
        if (after_forward) after_forward(a.micro, a.chunk);
        break;
      }
      case PipeOp::SendAct: {
        const void* out = owned > 0 ? stage.output(a.micro) : sl.x_out;
        TREX_CHECK(out, "pipeline: rank {} stage {} micro-batch {}: no output to send", rank_, s, a.micro);
        comm::WorkPtr w = act_out(s).send(out, act_bytes, a.peer, tag(false, s + 1, a.micro));
        if (owned > 0) slot_act_sends_[size_t(a.chunk)][slot] = std::move(w);
        else sends_.push_back({std::move(w), BoundaryRole::ActOut, sl.x_out});
        sl.x_out = nullptr;
        break;
      }
      case PipeOp::Backward: {
        wait_recv(sl.recv_grad);
        TREX_CHECK(s == S - 1 || sl.dx_out, "pipeline: rank {} stage {} micro-batch {}: no gradient received", rank_,
                   s, a.micro);
        if (owned > 0) {
          before_reuse(slot_act_sends_[size_t(a.chunk)][slot]);   // the forward output is freed by this backward
          before_reuse(slot_grad_sends_[size_t(a.chunk)][slot]);  // the slot's previous input gradient has left
        } else if (s > 0) {
          sl.dx_in = mem_.take(BoundaryRole::GradOut);
        }
        if (before_backward) before_backward(a.micro, a.chunk);
        mem_.compute_begin(s, true);
        const auto t0 = Clock::now();
        stage.backward(a.micro, s < S - 1 ? sl.dx_out : nullptr, sl.dx_in);
        const double dt = since(t0);
        mem_.compute_end(s, true);
        st.compute_s += dt;
        t_bwd[size_t(s)] += dt;
        --in_flight;
        mem_.give(BoundaryRole::ActIn, sl.x_in);
        mem_.give(BoundaryRole::GradIn, sl.dx_out);
        sl.x_in = sl.dx_out = nullptr;
        if (s == 0) slots.erase({a.micro, a.chunk});
        break;
      }
      case PipeOp::SendGrad: {
        const void* out = owned > 0 ? stage.input_grad(a.micro) : sl.dx_in;
        TREX_CHECK(out, "pipeline: rank {} stage {} micro-batch {}: no input gradient to send", rank_, s, a.micro);
        comm::WorkPtr w = grad_out(s).send(out, grad_bytes, a.peer, tag(true, s - 1, a.micro));
        if (owned > 0) slot_grad_sends_[size_t(a.chunk)][slot] = std::move(w);
        else sends_.push_back({std::move(w), BoundaryRole::GradOut, sl.dx_in});
        slots.erase({a.micro, a.chunk});
        break;
      }
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
    ch_.act->all_reduce(times.data(), times.size(), comm::ElemType::F64, comm::ReduceOp::Sum)->wait();
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
