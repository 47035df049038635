// Runs n ranks as threads of the test process: fn(rank) on n threads; an exception on any rank fails the test
// with the rank and its message.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace trex::testing {

inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        err[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r)
    if (err[size_t(r)]) {
      try {
        std::rethrow_exception(err[size_t(r)]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    }
}

}  // namespace trex::testing
