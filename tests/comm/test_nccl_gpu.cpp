// The NCCL communicator on two GPUs of one host, one thread per rank (no launcher needed): the TCP rendezvous,
// device-side ordering with stream_wait, and the timeout that aborts naming the rank and operation. Needs 2 GPUs (skipped
// with a message otherwise: NCCL refuses two ranks of one communicator on the same device).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <exception>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/nccl_communicator.h"
#include "comm/two_rank_threads.h"

namespace {

using namespace trex;
using comm::ElemType;
using comm::ReduceOp;

using trex::testing::n_devices;
using trex::testing::run2;

#define REQUIRE_2_GPUS()                                                            \
  if (n_devices() < 2) GTEST_SKIP() << "needs 2 GPUs, " << n_devices() << " visible"

template <typename T>
T* to_dev(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)), cudaSuccess);
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaDeviceSynchronize();
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}


// The collectives, point to point and split against the host: the shared cases (comm_cases.h) in
// test_comm_cases_gpu.cpp (CommCases/Device.*/nccl2).

// The operation starts after work queued on the input stream and a consumer stream can wait on the device:
// a kernel-free chain memset(default stream) -> all_reduce (comm stream) -> memcpy (consumer stream), no host
// synchronisation in between.
TEST(NcclComm, StreamOrdering) {
  REQUIRE_2_GPUS();
  const comm::NcclId id = comm::nccl_new_id();
  const size_t n = size_t(1) << 22;
  run2([&](int r) {
    auto c = comm::make_nccl_communicator(id, r, 2, r, 60);
    auto* api = dynamic_cast<comm::NcclCommunicatorApi*>(c.get());
    ASSERT_NE(api, nullptr);
    float *a = nullptr, *b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, n * 4), cudaSuccess);
    cudaDeviceSynchronize();
    std::vector<float> ones(n, float(r + 1));
    cudaMemcpyAsync(a, ones.data(), n * 4, cudaMemcpyHostToDevice, nullptr);  // default (input) stream
    auto w = c->all_reduce(a, n, ElemType::F32, ReduceOp::Sum);
    cudaStream_t consumer;
    cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking);
    comm::stream_wait(*w, consumer);
    cudaMemcpyAsync(b, a, n * 4, cudaMemcpyDeviceToDevice, consumer);
    cudaStreamSynchronize(consumer);
    std::vector<float> got(n);
    cudaMemcpy(got.data(), b, n * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i += 4097) ASSERT_EQ(got[i], 3.f) << "element " << i;
    EXPECT_TRUE(w->test());
    cudaStreamDestroy(consumer);
    cudaFree(a);
    cudaFree(b);
  });
}

TEST(NcclComm, TcpRendezvous) {
  REQUIRE_2_GPUS();
  const int port = 20000 + int(getpid() % 20000);
  comm::NcclId ids[2];
  run2([&](int r) { ids[r] = comm::tcp_rendezvous_id("127.0.0.1", port, r, 2, 30); });
  ASSERT_EQ(std::memcmp(ids[0].data(), ids[1].data(), ids[0].size()), 0) << "rank 1 got a different id";
  run2([&](int r) {
    auto c = comm::make_nccl_communicator(ids[r], r, 2, r, 60);
    float* d = to_dev(std::vector<float>{float(10 * r + 1)});
    c->all_reduce(d, 1, ElemType::F32, ReduceOp::Sum)->wait();
    EXPECT_EQ(to_host(d, 1)[0], 12.f);
    cudaFree(d);
  });
}

TEST(NcclComm, RendezvousTimesOutNamingTheRank) {
  const int port = 20000 + int((getpid() + 7919) % 20000);
  try {
    comm::tcp_rendezvous_id("127.0.0.1", port, 1, 2, 0.5);  // nobody listens
    FAIL() << "expected a timeout";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 could not reach rank 0"), std::string::npos) << e.what();
  }
}

// A peer that stops taking part: rank 0's wait gives up after the timeout, says which rank and which operation,
// and exits with status 3. Run in a child process this test spawns itself (the binary filtered to the disabled
// scenario below), under `timeout` so that a regression fails instead of hanging. Both ranks first complete one
// all_reduce: NCCL connects peers lazily inside the first collective call, which blocks on the host until every
// rank makes it (a hang there is at start-up, outside the operations' timeouts).
TEST(NcclComm, HungPeerAbortsWithRankAndOp) {
  REQUIRE_2_GPUS();
  char self[4096] = {0};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const std::string cmd = std::string("timeout -k 2 40 ") + self +
                          " --gtest_also_run_disabled_tests --gtest_filter=NcclCommChild.DISABLED_HungPeer 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f)) out += buf;
  const int st = pclose(f);
  ASSERT_TRUE(WIFEXITED(st)) << out;
  EXPECT_EQ(WEXITSTATUS(st), 3) << "expected exit status 3 (124 = the child hung past 40 s)\n" << out;
  EXPECT_NE(out.find("rank 0: NCCL all_reduce (4096 bytes) did not complete within 2.0 s"), std::string::npos) << out;
}

TEST(NcclCommChild, DISABLED_HungPeer) {
  const comm::NcclId id = comm::nccl_new_id();
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto c = comm::make_nccl_communicator(id, r, 2, r, 2.0);
      float* d = nullptr;
      cudaMalloc(&d, 4096);
      c->all_reduce(d, 1024, ElemType::F32, ReduceOp::Sum)->wait();  // connects the peers
      if (r == 0) c->all_reduce(d, 1024, ElemType::F32, ReduceOp::Sum)->wait();  // rank 1 never joins
      std::this_thread::sleep_for(std::chrono::seconds(10));
    });
  for (auto& t : ts) t.join();
  std::fprintf(stderr, "the hung all_reduce was not detected\n");
  std::_Exit(0);
}

}  // namespace
