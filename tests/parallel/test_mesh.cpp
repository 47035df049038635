#include <gtest/gtest.h>

#include "comm/communicator.h"
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
  EXPECT_THROW(parse_mesh_spec("tp=2"), trex::Error);
  EXPECT_EQ(check_mesh(s, 8, {44, 64}), "");
  EXPECT_NE(check_mesh(s, 6, {44, 64}).find("processes were launched"), std::string::npos);
  EXPECT_NE(check_mesh({1, 4, 3, 1}, 4, {4, 12}).find("does not divide dp=4"), std::string::npos);
  EXPECT_NE(check_mesh({1, 4, 4, 1}, 4, {4, 6}).find("does not divide the 6 routed experts"), std::string::npos);
  EXPECT_NE(check_mesh({4, 1, 1, 2}, 4, {6, 4}).find("for only 6 layers"), std::string::npos);
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
