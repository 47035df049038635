// The communicator cases (comm_cases.h) on device memory: the thread group with 2, 3 and 4 ranks on ONE GPU (what
// the partitioned trainer's tests use to emulate several ranks) and NCCL with 2 ranks on 2 GPUs (skipped with
// fewer). Then the thread group's device-side ordering: the operation starts after the work each rank queued on
// the legacy default stream, and comm::stream_wait orders a consumer stream after it without a host wait for the
// data.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/comm_cases.h"
#include "comm/nccl_communicator.h"
#include "comm/thread_group.h"
#include "comm/two_rank_threads.h"

namespace {

using namespace trex;
using trex::testing::CommBackend;
using trex::testing::CommCases;

struct DeviceMem final : trex::testing::Mem {
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes ? bytes : 1), cudaSuccess);
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void put(void* d, const void* s, size_t n) override { EXPECT_EQ(cudaMemcpy(d, s, n, cudaMemcpyHostToDevice), cudaSuccess); }
  void get(void* d, const void* s, size_t n) override { EXPECT_EQ(cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost), cudaSuccess); }
};

std::string need_gpus(int n) {
  const int have = trex::testing::n_devices();
  return have >= n ? "" : "needs " + std::to_string(n) + " GPUs, " + std::to_string(have) + " visible";
}

CommBackend threads_dev(int n) {
  CommBackend b;
  b.name = "threads_device", b.backend = "threads", b.ranks = n;
  b.group = [](int k) { return trex::testing::shared_group(comm::make_thread_group(k, 60.0)); };
  b.mem = [] { return std::make_unique<DeviceMem>(); };
  b.unavailable = [] { return need_gpus(1); };
  return b;
}

CommBackend nccl2() {
  CommBackend b;
  b.name = "nccl", b.backend = "nccl", b.ranks = 2, b.tags = false, b.rank_order = false;
  b.group = [](int k) {
    const comm::NcclId id = comm::nccl_new_id();
    return [id, k](int r) { return comm::make_nccl_communicator(id, r, k, r, 60); };
  };
  b.mem = [] { return std::make_unique<DeviceMem>(); };
  b.unavailable = [] { return need_gpus(2); };
  return b;
}

TEST_P(CommCases, Collectives) { run(trex::testing::check_collectives); }
TEST_P(CommCases, Split) {
  run([](const CommBackend&, comm::Communicator& c, trex::testing::Mem& m) { trex::testing::check_split(c, m); });
}

INSTANTIATE_TEST_SUITE_P(Device, CommCases, ::testing::Values(threads_dev(2), threads_dev(3), threads_dev(4), nccl2()),
                         trex::testing::backend_label);

// memset-free chain per rank: H2D copy on the legacy default stream -> all_reduce -> D2D copy on a consumer stream
// ordered by stream_wait; the host synchronises only the consumer stream.
TEST(ThreadGroupGpu, StreamOrdering) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const size_t n = size_t(1) << 22;
  auto g = comm::make_thread_group(2, 60.0);
  trex::testing::run2([&](int r) {
    float *a = nullptr, *b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, n * 4), cudaSuccess);
    std::vector<float> ones(n, float(r + 1));
    cudaMemcpyAsync(a, ones.data(), n * 4, cudaMemcpyHostToDevice, nullptr);
    auto w = g[size_t(r)]->all_reduce(a, n, comm::ElemType::F32, comm::ReduceOp::Sum);
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

// A device buffer of one rank and a host buffer of another in one copy operation (broadcast) work; a reduction
// over a mix is refused with a message.
TEST(ThreadGroupGpu, MixedHostAndDeviceBuffers) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  auto g = comm::make_thread_group(2, 30.0);
  std::string err[2];
  trex::testing::run2([&](int r) {
    std::vector<float> h(16, float(r + 5));
    float* d = nullptr;
    if (r == 0) {
      ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
      cudaMemcpy(d, h.data(), 64, cudaMemcpyHostToDevice);
    }
    void* buf = r == 0 ? static_cast<void*>(d) : static_cast<void*>(h.data());
    g[size_t(r)]->broadcast(buf, 64, 0)->wait();
    if (r == 1) {
      for (float v : h) ASSERT_EQ(v, 5.f);
    }
    try {
      g[size_t(r)]->all_reduce(buf, 16, comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
    } catch (const std::exception& e) {
      err[r] = e.what();
    }
    if (d) cudaFree(d);
  });
  for (const std::string& e : err) EXPECT_NE(e.find("not a mix"), std::string::npos) << e;
}

}  // namespace
