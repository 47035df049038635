// The communicator cases (comm_cases.h) on host memory: the local communicator and the thread group with 1..4
// ranks; then what only the thread group has: the time-out naming the missing rank, disagreeing ranks, a
// mismatched send / recv, ordering (a rank's Work completes only once every rank arrived), and a failed rank's
// abort stopping the others (in the world and in groups split from it) with its name, long before the timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "comm/comm_cases.h"
#include "comm/rank_threads.h"
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

// Rank 3 of 4 throws before its part of the step; without the abort ranks 0..2 would wait the whole 60 s timeout.
// Rank 0 waits in a world all_reduce, rank 1 in a recv from rank 3 of a sub-group split off the world (the
// pipeline / EP groups of a mesh are such splits), rank 2 in a sub-group all_reduce: all three stop at once with
// an error naming rank 3 and its reason, and the group refuses later operations with the same reason.
TEST(ThreadGroup, FailedRankAbortsEveryGroupNamingIt) {
  auto world = comm::make_thread_group(4, 60.0);
  std::vector<std::unique_ptr<comm::Communicator>> sub(4);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> err = trex::testing::run_ranks_collect(
      4,
      [&](int r) {
        sub[size_t(r)] = world[size_t(r)]->split(r % 2, r);  // {0, 2} and {1, 3}
        float x = float(r);
        world[size_t(r)]->all_reduce(&x, 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait();  // all arrive
        if (r == 3) throw std::runtime_error("out of memory in the MoE backward");
        if (r == 0) world[0]->all_reduce(&x, 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
        if (r == 1) sub[1]->recv(&x, 4, 1, 7)->wait();  // rank 3 is rank 1 of {1, 3}
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));  // arrives after the abort: refused
          sub[2]->all_reduce(&x, 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
        }
      },
      &world);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 10.0) << "the ranks waited for the timeout instead of the abort";
  EXPECT_EQ(err[3], "out of memory in the MoE backward");
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(err[size_t(r)].find("rank 3 failed: out of memory in the MoE backward"), std::string::npos)
        << "rank " << r << ": " << err[size_t(r)];
  const std::string late = message_of([&] { world[1]->barrier(); });
  EXPECT_NE(late.find("rank 3 failed"), std::string::npos) << late;
}

// In a sub-group the failed rank is named by its rank in the world, not in the sub-group.
TEST(ThreadGroup, AbortInASubGroupNamesTheWorldRank) {
  auto world = comm::make_thread_group(2, 60.0);
  std::vector<std::unique_ptr<comm::Communicator>> sub(2);
  std::thread t([&] { sub[1] = world[1]->split(0, -1); });  // key -1: world rank 1 is rank 0 of the sub-group
  sub[0] = world[0]->split(0, 0);
  t.join();
  ASSERT_EQ(sub[1]->rank(), 0);
  std::string waiting;
  std::thread w([&] {
    float x = 0;
    waiting = message_of([&] { world[0]->recv(&x, 4, 1, 0)->wait(); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  sub[1]->abort("bad batch");
  w.join();
  EXPECT_NE(waiting.find("rank 1 failed: bad batch"), std::string::npos) << waiting;
}

}  // namespace
