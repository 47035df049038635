// Runs n ranks as threads of the test process: fn(rank) on n threads; an exception on any rank fails the test
// with the rank and its message. With the ranks' world communicators, a rank that throws first aborts the group
// (Communicator::abort): the others stop with "rank R failed: ..." instead of waiting for it until the timeout.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace trex::testing {

// The error of each rank ("" where fn returned).
inline std::vector<std::string> run_ranks_collect(int n, const std::function<void(int)>& fn,
                                                  const std::vector<std::unique_ptr<comm::Communicator>>* world) {
  std::vector<std::string> err(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        err[size_t(r)] = e.what();
        if (world) (*world)[size_t(r)]->abort(e.what());
      } catch (...) {
        err[size_t(r)] = "unknown exception";
        if (world) (*world)[size_t(r)]->abort("unknown exception");
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

inline void report_rank_errors(const std::vector<std::string>& err) {
  for (size_t r = 0; r < err.size(); ++r)
    if (!err[r].empty()) ADD_FAILURE() << "rank " << r << ": " << err[r];
}

inline void run_ranks(int n, const std::function<void(int)>& fn) { report_rank_errors(run_ranks_collect(n, fn, nullptr)); }

inline void run_ranks(const std::vector<std::unique_ptr<comm::Communicator>>& world,
                      const std::function<void(int)>& fn) {
  report_rank_errors(run_ranks_collect(int(world.size()), fn, &world));
}

}  // namespace trex::testing
