#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/thread_group.h"
#include "core/error.h"
#include "parallel/expert_dispatch.h"
#include "parallel/mesh.h"

using namespace trex::parallel;

TEST(Mesh, ParseAndCheck) {
  MeshSpec s = parse_mesh_spec("PP2 DP4 EP2");
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.dp, 4);
  EXPECT_EQ(s.ep, 2);
  EXPECT_EQ(parse_mesh_spec("pp=1,dp=8,ep=8,vpp=1").ep, 8);
  EXPECT_EQ(parse_mesh_spec("tp=2").tp, 2);
  EXPECT_EQ(parse_mesh_spec("PP2 DP4 EP2 TP2").tp, 2);
  EXPECT_THROW(parse_mesh_spec("cp=2"), trex::Error);
  EXPECT_EQ(check_mesh(s, 8, {44, 64}), "");
  EXPECT_NE(check_mesh(s, 6, {44, 64}).find("processes were launched"), std::string::npos);
  EXPECT_NE(check_mesh({1, 4, 3, 1}, 4, {4, 12}).find("does not divide dp=4"), std::string::npos);
  EXPECT_NE(check_mesh({1, 4, 4, 1}, 4, {4, 6}).find("does not divide the 6 routed experts"), std::string::npos);
  EXPECT_NE(check_mesh({4, 1, 1, 2}, 4, {6, 4}).find("for only 6 layers"), std::string::npos);
  // Tensor parallelism: world = pp x dp x tp, and tp divides what it splits.
  const MeshSpec t = parse_mesh_spec("pp=2,dp=2,ep=2,tp=2");
  EXPECT_EQ(check_mesh(t, 8, {4, 8, 64, 8, 2048}), "");
  EXPECT_NE(check_mesh(t, 4, {4, 8}).find("pp=2 x dp=2 x tp=2 = 8 ranks, but 4"), std::string::npos);
  EXPECT_NE(check_mesh({1, 1, 1, 1, 3}, 3, {4, 8, 64, 8, 2048}).find("tp=3 does not divide the 64 attention query heads"),
            std::string::npos);
  EXPECT_NE(check_mesh({1, 1, 1, 1, 4}, 4, {4, 8, 64, 2, 2048}).find("tp=4 does not divide the attention's 2 output"),
            std::string::npos);
  EXPECT_NE(check_mesh({1, 1, 1, 1, 2}, 2, {4, 8, 64, 8, 3}).find("shared expert's hidden width 3"), std::string::npos);
  EXPECT_EQ(check_mesh({1, 1, 1, 1, 0}, 0, {4, 8}), "every parallel degree must be >= 1");
  // Expert tensor parallelism: etp is 1 or tp (it adds no rank) and splits the experts' width into multiples of 8.
  const MeshSpec e = parse_mesh_spec("PP2 DP2 EP2 TP2 ETP2");
  EXPECT_EQ(e.etp, 2);
  EXPECT_EQ(parse_mesh_spec("pp=1,dp=2,tp=2,etp=2").etp, 2);
  EXPECT_EQ(check_mesh(e, 8, {4, 8, 64, 8, 2048, 2048}), "");
  EXPECT_NE(check_mesh({1, 2, 1, 1, 2, 4}, 4, {4, 8, 64, 8, 2048, 2048}).find("etp=4 must be 1"), std::string::npos);
  EXPECT_NE(check_mesh({1, 2, 1, 1, 2, 2}, 4, {4, 8, 64, 8, 2048, 24}).find("width 24 into multiples of 8"),
            std::string::npos);
}

// The groups of pp=2 x dp=2 (ep=2) x tp=2 on 8 thread ranks: TP innermost (consecutive world ranks), and the DP /
// EP / PP groups formed among the ranks of one TP rank, as Megatron orders them.
TEST(Mesh, TensorParallelGroupsAreInnermost) {
  const MeshSpec spec = parse_mesh_spec("pp=2,dp=2,ep=2,tp=2");
  auto ranks = trex::comm::make_thread_group(8, 60.0);
  struct Seen {
    int pp, dp, tp, ep;
    std::vector<float> tp_sum, dp_sum, pp_sum;
  };
  std::vector<Seen> seen(8);
  std::vector<std::thread> ts;
  for (int r = 0; r < 8; ++r)
    ts.emplace_back([&, r] {
      Mesh m = build_mesh(*ranks[size_t(r)], spec, {4, 8});
      Seen& s = seen[size_t(r)];
      s.pp = m.pp_rank, s.dp = m.dp_rank, s.tp = m.tp_rank, s.ep = m.ep_rank;
      // Each group's sum of world ranks tells who is in it.
      for (auto [g, out] : {std::pair{m.tp_group.get(), &s.tp_sum}, std::pair{m.dp_group.get(), &s.dp_sum},
                            std::pair{m.pp_group.get(), &s.pp_sum}}) {
        std::vector<float> v{float(r)};
        g->all_reduce(v.data(), 1, trex::comm::ElemType::F32, trex::comm::ReduceOp::Sum)->wait();
        *out = v;
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 8; ++r) {
    const Seen& s = seen[size_t(r)];
    EXPECT_EQ(s.tp, r % 2) << r;
    EXPECT_EQ(s.dp, (r / 2) % 2) << r;
    EXPECT_EQ(s.pp, r / 4) << r;
    EXPECT_EQ(s.ep, s.dp % 2) << r;
    const int base = r - s.tp;  // the TP group: r and its neighbour
    EXPECT_EQ(s.tp_sum[0], float(base + base + 1)) << r;
    const int dp0 = s.pp * 4 + s.tp;  // the DP group: same stage and TP rank, DP ranks 0 and 1
    EXPECT_EQ(s.dp_sum[0], float(dp0 + dp0 + 2)) << r;
    const int pp0 = s.dp * 2 + s.tp;  // the PP group: same DP and TP rank, stages 0 and 1
    EXPECT_EQ(s.pp_sum[0], float(pp0 + pp0 + 4)) << r;
  }
}

TEST(ExpertDispatch, SingleRankRoundTripGroupsByExpert) {
  auto comm = trex::comm::make_local_communicator();
  const int experts = 4, topk = 2, tokens = 5, hidden = 3;
  ExpertDispatcher d(*comm, experts, hidden);
  std::vector<int32_t> route = {3, 0, 1, 3, 2, 0, 0, 1, 3, 2};
  std::vector<float> x(tokens * hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  auto h = d.plan(route.data(), tokens, topk);
  ASSERT_EQ(h.expert_counts, (std::vector<int64_t>{3, 2, 2, 3}));
  std::vector<float> grouped;
  auto p = d.dispatch(h, x.data(), &grouped);
  p.wait();
  // Expert 0's rows are tokens 0, 2, 3 (slots 1, 5, 6), in slot order.
  EXPECT_EQ(grouped[0], x[0 * hidden]);
  EXPECT_EQ(grouped[hidden], x[2 * hidden]);
  EXPECT_EQ(grouped[2 * hidden], x[3 * hidden]);
  std::vector<float> slots;
  auto c = d.combine(h, grouped.data(), &slots);
  c.wait();
  for (int s = 0; s < tokens * topk; ++s)
    for (int k = 0; k < hidden; ++k) EXPECT_EQ(slots[s * hidden + k], x[(s / topk) * hidden + k]);
}

TEST(ExpertDispatch, RejectsExpertOutOfRange) {
  auto comm = trex::comm::make_local_communicator();
  ExpertDispatcher d(*comm, 4, 2);
  std::vector<int32_t> route = {0, 4};
  EXPECT_THROW(d.plan(route.data(), 1, 2), trex::Error);
}
