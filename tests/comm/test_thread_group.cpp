// The communicator cases (comm_cases.h) on host memory: the local communicator and the thread group with 1..4
// ranks; then what only the thread group has: the time-out naming the missing rank, disagreeing ranks, a
// mismatched send / recv, and ordering (a rank's Work completes only once every rank arrived).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/comm_cases.h"
#include "comm/thread_group.h"

namespace {

using namespace trex;
using trex::testing::CommBackend;
using trex::testing::CommCases;
using trex::testing::HostMem;

CommBackend threads(int n) {
  CommBackend b;
  b.name = "threads", b.backend = "threads", b.ranks = n;
  b.group = [](int k) { return trex::testing::shared_group(comm::make_thread_group(k, 30.0)); };
  b.mem = [] { return std::make_unique<HostMem>(); };
  return b;
}

CommBackend local() {
  CommBackend b;
  b.name = "local", b.backend = "local", b.ranks = 1, b.p2p = false;
  b.group = [](int) { return [](int) { return comm::make_local_communicator(); }; };
  b.mem = [] { return std::make_unique<HostMem>(); };
  return b;
}

TEST_P(CommCases, Collectives) { run(trex::testing::check_collectives); }
TEST_P(CommCases, Split) {
  run([](const CommBackend&, comm::Communicator& c, trex::testing::Mem& m) { trex::testing::check_split(c, m); });
}

INSTANTIATE_TEST_SUITE_P(Host, CommCases, ::testing::Values(local(), threads(1), threads(2), threads(3), threads(4)),
                         trex::testing::backend_label);

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ThreadGroup, MissingRankTimesOutNamingIt) {
  auto g = comm::make_thread_group(3, 0.3);
  float x[4] = {1, 2, 3, 4};
  std::string msg[2];
  std::thread t([&] { msg[1] = message_of([&] { g[1]->all_reduce(x + 0, 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait(); }); });
  float y = 0;
  const auto start = std::chrono::steady_clock::now();
  msg[0] = message_of([&] { g[0]->all_reduce(&y, 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait(); });
  t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 5.0);
  // Whichever rank timed out first names rank 2 (which never called); the other stops with the same reason.
  for (const std::string& m : msg) {
    EXPECT_NE(m.find("all_reduce (4 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 never arrived"), std::string::npos) << m;
  }
  // The group is failed: the late rank is told so instead of waiting.
  const std::string late = message_of([&] { g[2]->barrier(); });
  EXPECT_NE(late.find("after the group failed"), std::string::npos) << late;
}

TEST(ThreadGroup, UnmatchedRecvTimesOutNamingThePeer) {
  auto g = comm::make_thread_group(2, 0.2);
  float y = 0;
  const std::string m = message_of([&] { g[1]->recv(&y, 4, 0, 5)->wait(); });
  EXPECT_NE(m.find("recv from rank 0 (tag 5, 4 bytes) did not complete within 0.2 s: rank 0 never arrived"),
            std::string::npos)
      << m;
}

TEST(ThreadGroup, DisagreeingRanksFailBoth) {
  auto g = comm::make_thread_group(2, 5.0);
  float x = 1;
  std::string a, b;
  std::thread t([&] { a = message_of([&] { g[0]->all_reduce(&x, 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  float y = 2;
  b = message_of([&] { g[1]->broadcast(&y, 4, 0)->wait(); });
  t.join();
  EXPECT_NE(b.find("disagrees: rank 1 called broadcast"), std::string::npos) << b;
  EXPECT_NE(a.find("disagrees"), std::string::npos) << a;
}

TEST(ThreadGroup, SendRecvSizeMismatchIsAnError) {
  auto g = comm::make_thread_group(2, 5.0);
  float x[2] = {1, 2};
  auto w = g[0]->send(x, 8, 1, 0);
  const std::string m = message_of([&] { g[1]->recv(x, 4, 0, 0)->wait(); });
  EXPECT_NE(m.find("rank 0 sends 8 bytes to rank 1 (tag 0), which receives 4 bytes"), std::string::npos) << m;
  const std::string m0 = message_of([&] { w->wait(); });
  EXPECT_NE(m0.find("sends 8 bytes"), std::string::npos) << m0;
}

// Work is asynchronous: rank 0's all_reduce returns at once and is not complete until rank 1 joins.
TEST(ThreadGroup, WorkCompletesWhenTheLastRankArrives) {
  auto g = comm::make_thread_group(2, 10.0);
  float a = 1, b = 2;
  auto w0 = g[0]->all_reduce(&a, 1, comm::ElemType::F32, comm::ReduceOp::Sum);
  EXPECT_FALSE(w0->test());
  EXPECT_EQ(a, 1.f);
  auto w1 = g[1]->all_reduce(&b, 1, comm::ElemType::F32, comm::ReduceOp::Sum);
  EXPECT_TRUE(w0->test());
  w0->wait();
  w1->wait();
  EXPECT_EQ(a, 3.f);
  EXPECT_EQ(b, 3.f);
  // A negative color leaves a rank out (MPI_UNDEFINED).
  std::unique_ptr<comm::Communicator> s0, s1;
  std::thread t([&] { s1 = g[1]->split(-1, 0); });
  s0 = g[0]->split(3, 0);
  t.join();
  ASSERT_TRUE(s0);
  EXPECT_EQ(s0->size(), 1);
  EXPECT_FALSE(s1);
}

}  // namespace
