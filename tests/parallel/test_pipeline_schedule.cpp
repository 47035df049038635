// Pipeline schedules: generated 1F1B and interleaved schedules over a grid of (pp, vpp, micro-batches)
// run to completion in the simulator, keep the in-flight bound, and have the bubble of the formula
// (pp - 1) / (vpp * M + pp - 1); and the simulator itself catches broken schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

using namespace trex::parallel;

namespace {

double bubble_formula(int P, int V, int64_t M) { return double(P - 1) / double(V * M + P - 1); }

}  // namespace

TEST(PipelineSchedule, OneFOneBGrid) {
  for (int P : {1, 2, 3, 4, 8})
    for (int64_t M : {1, 2, 3, 4, 7, 8, 16}) {
      Schedule s = make_schedule({P, 1, M, ScheduleKind::OneFOneB});
      SimResult r = simulate_schedule(s);
      ASSERT_TRUE(r.ok()) << "P=" << P << " M=" << M << ": " << r.error;
      for (int rank = 0; rank < P; ++rank) {
        // PipeDream-flush keeps at most P - rank micro-batches alive (and never more than M).
        EXPECT_LE(r.max_in_flight[size_t(rank)], std::min<int64_t>(P - rank, M)) << "P=" << P << " M=" << M;
        EXPECT_EQ(r.max_in_flight[size_t(rank)], std::min<int64_t>(P - rank, M)) << "P=" << P << " M=" << M;
      }
      // t_f = 1, t_b = 2 per micro-batch: makespan (M + P - 1) * 3 exactly.
      EXPECT_NEAR(r.makespan, double(M + P - 1) * 3.0, 1e-9) << "P=" << P << " M=" << M;
      EXPECT_NEAR(r.bubble_fraction, bubble_formula(P, 1, M), 1e-9) << "P=" << P << " M=" << M;
    }
}

TEST(PipelineSchedule, InterleavedGrid) {
  for (int P : {2, 3, 4})
    for (int V : {1, 2, 3, 4})
      for (int64_t groups : {1, 2, 3, 4}) {
        const int64_t M = groups * P;
        Schedule s = make_schedule({P, V, M, ScheduleKind::Interleaved});
        SimResult r = simulate_schedule(s);
        ASSERT_TRUE(r.ok()) << "P=" << P << " V=" << V << " M=" << M << ": " << r.error;
        for (int rank = 0; rank < P; ++rank) {
          const int64_t bound = std::min<int64_t>(int64_t(P - rank - 1) * 2 + int64_t(V - 1) * P + 1, M * V);
          EXPECT_LE(r.max_in_flight[size_t(rank)], bound) << "P=" << P << " V=" << V << " M=" << M;
        }
        // Chunks take 1/V and 2/V: the step takes exactly 3 (M + (P - 1) / V).
        EXPECT_NEAR(r.bubble_fraction, bubble_formula(P, V, M), 1e-9) << "P=" << P << " V=" << V << " M=" << M;
        EXPECT_NEAR(r.makespan, 3.0 * (double(M) + double(P - 1) / V), 1e-9)
            << "P=" << P << " V=" << V << " M=" << M;
      }
}

TEST(PipelineSchedule, InterleavingShrinksTheBubble) {
  const double b1 = simulate_schedule(make_schedule({4, 1, 8, ScheduleKind::OneFOneB})).bubble_fraction;
  const double b2 = simulate_schedule(make_schedule({4, 2, 8, ScheduleKind::Interleaved})).bubble_fraction;
  const double b4 = simulate_schedule(make_schedule({4, 4, 8, ScheduleKind::Interleaved})).bubble_fraction;
  EXPECT_GT(b1, b2);
  EXPECT_GT(b2, b4);
}

TEST(PipelineSchedule, EveryLookaheadIsDeadlockFreeAndPostsReceivesEarly) {
  for (int la : {0, 1, 2, 5})
    for (auto [P, V, M] : {std::tuple{4, 1, 6}, std::tuple{2, 2, 4}, std::tuple{4, 3, 8}}) {
      ScheduleSpec spec{P, V, M, V == 1 ? ScheduleKind::OneFOneB : ScheduleKind::Interleaved, la};
      Schedule s = make_schedule(spec);
      SimResult r = simulate_schedule(s, {{}, {}, 0.25});
      ASSERT_TRUE(r.ok()) << r.error;
      if (la > 0) {
        // The receive of a compute action comes before the previous compute action of the rank.
        for (int rank = 0; rank < P; ++rank) {
          const auto& acts = s.ranks[size_t(rank)];
          for (size_t i = 0; i < acts.size(); ++i) {
            if (acts[i].op != PipeOp::Forward || s.stage_of(rank, acts[i].chunk) == 0) continue;
            size_t recv = 0, prev_compute = 0;
            bool seen_prev = false;
            for (size_t j = 0; j < i; ++j) {
              if (acts[j].op == PipeOp::RecvAct && acts[j].micro == acts[i].micro && acts[j].chunk == acts[i].chunk)
                recv = j;
              if (acts[j].op == PipeOp::Forward || acts[j].op == PipeOp::Backward) prev_compute = j, seen_prev = true;
            }
            if (seen_prev) EXPECT_LT(recv, prev_compute) << describe_actions(acts);
          }
        }
      }
    }
}

TEST(PipelineSchedule, LatencyIsHiddenOnlyUpToTheCompute) {
  // With latency the step gets longer, but the schedule still completes with the same work.
  Schedule s = make_schedule({4, 1, 8, ScheduleKind::OneFOneB});
  SimResult fast = simulate_schedule(s), slow = simulate_schedule(s, {{}, {}, 0.5});
  ASSERT_TRUE(fast.ok() && slow.ok());
  EXPECT_GT(slow.makespan, fast.makespan);
  for (int r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(fast.busy[size_t(r)], slow.busy[size_t(r)]);
}

TEST(PipelineSchedule, SimulatorCatchesBrokenSchedules) {
  // Backward before forward.
  Schedule s = make_schedule({2, 1, 2, ScheduleKind::OneFOneB});
  std::swap(s.ranks[1][1], s.ranks[1][0]);  // rank 1: F0 <-> ra0 would consume before posting
  EXPECT_NE(simulate_schedule(s).error.find("never posted"), std::string::npos) << simulate_schedule(s).error;

  s = make_schedule({2, 1, 2, ScheduleKind::OneFOneB});
  // Rank 0 does all its backwards first: it waits for gradients of forwards it never sent -> deadlock.
  {
    auto& a = s.ranks[0];
    std::stable_partition(a.begin(), a.end(),
                          [](const PipeAction& x) { return x.op == PipeOp::RecvGrad || x.op == PipeOp::RecvAct; });
    auto first_fwd = std::find_if(a.begin(), a.end(), [](const PipeAction& x) { return x.op == PipeOp::Forward; });
    auto first_bwd = std::find_if(a.begin(), a.end(), [](const PipeAction& x) { return x.op == PipeOp::Backward; });
    std::iter_swap(first_fwd, first_bwd);
  }
  EXPECT_NE(simulate_schedule(s).error, "");

  // A dropped send deadlocks and the error names the blocked rank.
  s = make_schedule({2, 1, 3, ScheduleKind::OneFOneB});
  auto& r0 = s.ranks[0];
  r0.erase(std::find_if(r0.begin(), r0.end(), [](const PipeAction& x) { return x.op == PipeOp::SendAct && x.micro == 1; }));
  std::string e = simulate_schedule(s).error;
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1"), std::string::npos) << e;

  // A missing backward is reported.
  s = make_schedule({2, 1, 2, ScheduleKind::OneFOneB});
  auto& r1 = s.ranks[1];
  r1.erase(std::find_if(r1.begin(), r1.end(), [](const PipeAction& x) { return x.op == PipeOp::Backward && x.micro == 1; }));
  r1.erase(std::find_if(r1.begin(), r1.end(), [](const PipeAction& x) { return x.op == PipeOp::SendGrad && x.micro == 1; }));
  e = simulate_schedule(s).error;
  EXPECT_NE(e, "");
}

TEST(PipelineSchedule, RefusesImpossibleSpecs) {
  EXPECT_NE(check_schedule_spec({4, 2, 6, ScheduleKind::Interleaved}).find("multiple of pp"), std::string::npos);
  EXPECT_NE(check_schedule_spec({2, 2, 4, ScheduleKind::OneFOneB}).find("interleaved"), std::string::npos);
  EXPECT_THROW(make_schedule({2, 1, 0, ScheduleKind::OneFOneB}), trex::Error);
  EXPECT_EQ(parse_schedule_kind("interleaved"), ScheduleKind::Interleaved);
  EXPECT_THROW(parse_schedule_kind("gpipe"), trex::Error);
}

TEST(PipelineSchedule, TagsAreUniqueWithinAStep) {
  ScheduleSpec spec{4, 2, 8, ScheduleKind::Interleaved};
  std::set<int> tags;
  for (int g = 0; g < 2; ++g)
    for (int s = 0; s < 8; ++s)
      for (int64_t m = 0; m < 8; ++m) EXPECT_TRUE(tags.insert(pipe_message_tag(spec, g == 1, s, m)).second);
  EXPECT_THROW(pipe_message_tag({8, 8, 4096, ScheduleKind::Interleaved}, false, 0, 0), trex::Error);
}
