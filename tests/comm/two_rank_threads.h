// Two-rank GPU tests in one process: each rank is a thread (its own device and NCCL communicator, or both on one
// device over the thread group, comm/thread_group.h).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>

#include "comm/rank_threads.h"

namespace trex::testing {

inline int n_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// Runs fn(rank) on two threads; an exception in either fails the test with its message.
inline void run2(const std::function<void(int)>& fn) { run_ranks(2, fn); }

}  // namespace trex::testing
