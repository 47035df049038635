#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "core/error.h"

namespace trex::parallel {

std::string schedule_kind_name(ScheduleKind k) { return k == ScheduleKind::OneFOneB ? "1f1b" : "interleaved"; }

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "1f1b" || name == "1F1B") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  fail("pipeline schedule '{}' (expected 1f1b or interleaved)", name);
}

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::RecvAct: return "recv-act";
    case PipeOp::Forward: return "forward";
    case PipeOp::SendAct: return "send-act";
    case PipeOp::RecvGrad: return "recv-grad";
    case PipeOp::Backward: return "backward";
    case PipeOp::SendGrad: return "send-grad";
  }
  return "?";
}

std::string check_schedule_spec(const ScheduleSpec& s) {
  if (s.pp < 1 || s.vpp < 1 || s.micro_batches < 1) return "pp, vpp and micro_batches must be >= 1";
  if (s.lookahead < 0) return "lookahead must be >= 0";
  if (s.kind == ScheduleKind::OneFOneB && s.vpp != 1)
    return fmt::format("the 1f1b schedule has one stage per rank (vpp={}): use the interleaved schedule", s.vpp);
  if (s.kind == ScheduleKind::Interleaved && s.micro_batches % s.pp != 0)
    return fmt::format("the interleaved schedule needs micro_batches ({}) to be a multiple of pp ({})",
                       s.micro_batches, s.pp);
  return "";
}

namespace {

struct Compute {
  bool forward;
  int64_t micro;
  int chunk;
};

// The compute order of rank r: warm-up forwards, then one forward + one backward, then the backwards.
std::vector<Compute> compute_order(const ScheduleSpec& s, int r) {
  const int P = s.pp, V = s.vpp;
  const int64_t M = s.micro_batches;
  const int64_t total = M * V;  // chunk-micro-batches per direction
  // k-th forward / backward of this rank as (micro, chunk).
  auto fwd_at = [&](int64_t k) -> Compute {
    if (s.kind == ScheduleKind::OneFOneB) return {true, k, 0};
    const int64_t in_group = k % (int64_t(P) * V);
    return {true, (k / (int64_t(P) * V)) * P + k % P, int(in_group / P)};
  };
  auto bwd_at = [&](int64_t k) -> Compute {
    if (s.kind == ScheduleKind::OneFOneB) return {false, k, 0};
    const int64_t in_group = k % (int64_t(P) * V);
    return {false, (k / (int64_t(P) * V)) * P + k % P, V - 1 - int(in_group / P)};
  };
  int64_t warmup = s.kind == ScheduleKind::OneFOneB ? int64_t(P - r - 1) : int64_t(P - r - 1) * 2 + int64_t(V - 1) * P;
  warmup = std::min(warmup, total);
  std::vector<Compute> out;
  out.reserve(size_t(2 * total));
  for (int64_t k = 0; k < warmup; ++k) out.push_back(fwd_at(k));
  for (int64_t i = 0; i < total - warmup; ++i) {
    out.push_back(fwd_at(warmup + i));
    out.push_back(bwd_at(i));
  }
  for (int64_t k = total - warmup; k < total; ++k) out.push_back(bwd_at(k));
  return out;
}

}  // namespace

Schedule make_schedule(const ScheduleSpec& spec) {
  const std::string why = check_schedule_spec(spec);
  TREX_CHECK(why.empty(), "impossible pipeline schedule: {}", why);
  Schedule sch;
  sch.spec = spec;
  const int P = spec.pp, S = sch.n_stages();
  sch.ranks.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    const std::vector<Compute> order = compute_order(spec, r);
    // Receives are posted `lookahead` compute actions early: recv_before[i] lists those posted right
    // before compute i.
    std::vector<std::vector<PipeAction>> recv_before(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const Compute& c = order[i];
      const int s = sch.stage_of(r, c.chunk);
      const size_t at = i >= size_t(spec.lookahead) ? i - size_t(spec.lookahead) : 0;
      if (c.forward && s > 0) recv_before[at].push_back({PipeOp::RecvAct, c.micro, c.chunk, sch.rank_of(s - 1)});
      if (!c.forward && s < S - 1) recv_before[at].push_back({PipeOp::RecvGrad, c.micro, c.chunk, sch.rank_of(s + 1)});
    }
    auto& acts = sch.ranks[size_t(r)];
    for (size_t i = 0; i < order.size(); ++i) {
      for (const auto& a : recv_before[i]) acts.push_back(a);
      const Compute& c = order[i];
      const int s = sch.stage_of(r, c.chunk);
      if (c.forward) {
        acts.push_back({PipeOp::Forward, c.micro, c.chunk, -1});
        if (s < S - 1) acts.push_back({PipeOp::SendAct, c.micro, c.chunk, sch.rank_of(s + 1)});
      } else {
        acts.push_back({PipeOp::Backward, c.micro, c.chunk, -1});
        if (s > 0) acts.push_back({PipeOp::SendGrad, c.micro, c.chunk, sch.rank_of(s - 1)});
      }
    }
  }
  return sch;
}

int pipe_message_tag(const ScheduleSpec& spec, bool gradient, int to_stage, int64_t micro, bool mpi_range) {
  const int64_t S = int64_t(spec.pp) * spec.vpp;
  const int64_t tag = ((gradient ? S : 0) + to_stage) * spec.micro_batches + micro;
  TREX_CHECK(!mpi_range || 2 * S * spec.micro_batches <= 32767,
             "pipeline step of {} stages x {} micro-batches needs {} message tags, more than MPI guarantees (32767): "
             "use fewer micro-batches per step (raise grad_accum's rows per micro-batch)",
             S, spec.micro_batches, 2 * S * spec.micro_batches);
  return int(tag);
}

std::string describe_actions(const std::vector<PipeAction>& actions) {
  std::string out;
  for (const auto& a : actions) {
    if (!out.empty()) out += ' ';
    switch (a.op) {
      case PipeOp::Forward: out += fmt::format("F{}.{}", a.micro, a.chunk); break;
      case PipeOp::Backward: out += fmt::format("B{}.{}", a.micro, a.chunk); break;
      case PipeOp::RecvAct: out += fmt::format("ra{}.{}<{}", a.micro, a.chunk, a.peer); break;
      case PipeOp::RecvGrad: out += fmt::format("rg{}.{}<{}", a.micro, a.chunk, a.peer); break;
      case PipeOp::SendAct: out += fmt::format("sa{}.{}>{}", a.micro, a.chunk, a.peer); break;
      case PipeOp::SendGrad: out += fmt::format("sg{}.{}>{}", a.micro, a.chunk, a.peer); break;
    }
  }
  return out;
}

SimResult simulate_schedule(const Schedule& sch, const SimOptions& opts) {
  const int P = sch.spec.pp, V = sch.spec.vpp, S = sch.n_stages();
  const int64_t M = sch.spec.micro_batches;
  SimResult res;
  auto err = [&](std::string e) {
    if (res.error.empty()) res.error = std::move(e);
  };
  if (int(sch.ranks.size()) != P) {
    res.error = fmt::format("schedule has {} rank lists for pp={}", sch.ranks.size(), P);
    return res;
  }
  auto dur = [&](const std::vector<double>& v, int s, double dflt) {
    return v.empty() ? dflt / V : v.at(size_t(s));
  };
  if ((!opts.t_fwd.empty() && int(opts.t_fwd.size()) != S) || (!opts.t_bwd.empty() && int(opts.t_bwd.size()) != S)) {
    res.error = fmt::format("SimOptions: per-stage durations need {} entries", S);
    return res;
  }
  // (micro, stage) -> time, for computes done and sends posted; (micro, stage) -> posted for receives.
  using Key = std::pair<int64_t, int>;
  std::map<Key, double> fwd_done, bwd_done, act_sent, grad_sent;  // sent: keyed by the receiving stage
  std::map<Key, bool> act_posted, grad_posted;                    // keyed by the consuming stage
  std::vector<size_t> pc(size_t(P), 0);
  std::vector<double> clock(size_t(P), 0.0);
  res.busy.assign(size_t(P), 0.0);
  res.max_in_flight.assign(size_t(P), 0);
  std::vector<int> in_flight(size_t(P), 0);

  auto where = [&](int r, const PipeAction& a) {
    return fmt::format("rank {} action {} ({} micro-batch {} chunk {})", r, pc[size_t(r)], pipe_op_name(a.op),
                       a.micro, a.chunk);
  };
  // Tries rank r's next action: 1 = done, 0 = blocked on a peer, -1 = invalid (error set).
  auto step = [&](int r) -> int {
    const PipeAction& a = sch.ranks[size_t(r)][pc[size_t(r)]];
    if (a.chunk < 0 || a.chunk >= V || a.micro < 0 || a.micro >= M) {
      err(fmt::format("{}: micro-batch or chunk out of range", where(r, a)));
      return -1;
    }
    const int s = sch.stage_of(r, a.chunk);
    const Key k{a.micro, s};
    double& t = clock[size_t(r)];
    switch (a.op) {
      case PipeOp::RecvAct:
      case PipeOp::RecvGrad: {
        const bool grad = a.op == PipeOp::RecvGrad;
        const int from = grad ? s + 1 : s - 1;
        if (from < 0 || from >= S) return err(where(r, a) + ": no stage to receive from"), -1;
        if (a.peer != sch.rank_of(from))
          return err(fmt::format("{}: receives from rank {}, but stage {} is on rank {}", where(r, a), a.peer, from,
                                 sch.rank_of(from))),
                 -1;
        auto& posted = grad ? grad_posted : act_posted;
        if (posted.count(k)) return err(where(r, a) + ": receive posted twice"), -1;
        posted[k] = true;
        return 1;
      }
      case PipeOp::Forward:
      case PipeOp::Backward: {
        const bool fwd = a.op == PipeOp::Forward;
        auto& done = fwd ? fwd_done : bwd_done;
        if (done.count(k)) return err(where(r, a) + ": computed twice"), -1;
        if (!fwd && !fwd_done.count(k)) return err(where(r, a) + ": backward before its forward"), -1;
        double ready = t;
        const bool needs_input = fwd ? s > 0 : s < S - 1;
        if (needs_input) {
          auto& posted = fwd ? act_posted : grad_posted;
          if (!posted.count(k)) return err(where(r, a) + ": its input's receive was never posted before it"), -1;
          auto& sent = fwd ? act_sent : grad_sent;
          auto it = sent.find(k);
          if (it == sent.end()) return 0;  // the producer has not sent yet
          ready = std::max(ready, it->second + opts.latency);
        }
        const double d = fwd ? dur(opts.t_fwd, s, 1.0) : dur(opts.t_bwd, s, 2.0);
        t = ready + d;
        res.busy[size_t(r)] += d;
        done[k] = t;
        in_flight[size_t(r)] += fwd ? 1 : -1;
        res.max_in_flight[size_t(r)] = std::max(res.max_in_flight[size_t(r)], in_flight[size_t(r)]);
        return 1;
      }
      case PipeOp::SendAct:
      case PipeOp::SendGrad: {
        const bool grad = a.op == PipeOp::SendGrad;
        const int to = grad ? s - 1 : s + 1;
        if (to < 0 || to >= S) return err(where(r, a) + ": no stage to send to"), -1;
        if (a.peer != sch.rank_of(to))
          return err(fmt::format("{}: sends to rank {}, but stage {} is on rank {}", where(r, a), a.peer, to,
                                 sch.rank_of(to))),
                 -1;
        if (!(grad ? bwd_done : fwd_done).count(k)) return err(where(r, a) + ": sends a tensor not computed yet"), -1;
        auto& sent = grad ? grad_sent : act_sent;
        const Key dst{a.micro, to};
        if (sent.count(dst)) return err(where(r, a) + ": sent twice"), -1;
        sent[dst] = t;
        return 1;
      }
    }
    return -1;
  };

  for (;;) {
    bool progressed = false, all_done = true;
    for (int r = 0; r < P; ++r) {
      while (pc[size_t(r)] < sch.ranks[size_t(r)].size()) {
        const int rc = step(r);
        if (rc < 0) return res;
        if (rc == 0) break;
        ++pc[size_t(r)];
        progressed = true;
      }
      all_done &= pc[size_t(r)] == sch.ranks[size_t(r)].size();
    }
    if (all_done) break;
    if (!progressed) {
      std::string blocked;
      for (int r = 0; r < P; ++r)
        if (pc[size_t(r)] < sch.ranks[size_t(r)].size())
          blocked += fmt::format("{}{}", blocked.empty() ? "" : "; ", where(r, sch.ranks[size_t(r)][pc[size_t(r)]]));
      res.error = "deadlock: " + blocked + " wait for inputs never sent";
      return res;
    }
  }
  // Completeness: every (micro, stage) forward and backward once, every receive matched by a send.
  for (int64_t m = 0; m < M; ++m)
    for (int s = 0; s < S; ++s) {
      const Key k{m, s};
      if (!fwd_done.count(k) || !bwd_done.count(k))
        err(fmt::format("micro-batch {} stage {} (rank {}) lacks its {}", m, s, sch.rank_of(s),
                        fwd_done.count(k) ? "backward" : "forward"));
    }
  for (const auto& [k, _] : act_sent)
    if (!act_posted.count(k)) err(fmt::format("activation of micro-batch {} into stage {} is never received", k.first, k.second));
  for (const auto& [k, _] : grad_sent)
    if (!grad_posted.count(k)) err(fmt::format("gradient of micro-batch {} into stage {} is never received", k.first, k.second));
  res.finish = clock;
  res.makespan = *std::max_element(clock.begin(), clock.end());
  double busy = 0;
  for (double b : res.busy) busy += b;
  res.bubble_fraction = res.makespan > 0 ? 1.0 - busy / (double(P) * res.makespan) : 0.0;
  return res;
}

}  // namespace trex::parallel
