// Two-rank GPU tests in one process: each rank is a thread (its own device and NCCL communicator).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace trex::testing {

inline int n_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// Runs fn(rank) on two threads; an exception in either fails the test with its message.
inline void run2(const std::function<void(int)>& fn) {
  std::exception_ptr err[2];
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r)
    if (err[r]) {
      try {
        std::rethrow_exception(err[r]);
      } catch (const std::exception& e) {
        FAIL() << "rank " << r << ": " << e.what();
      }
    }
}

}  // namespace trex::testing
