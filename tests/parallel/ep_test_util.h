// Helpers of the expert-parallel tests: worker mode under mpirun, the world communicator, launching the workers,
// and fp32 comparisons against a single-process reference.
//
// An EpMpi test launches this binary under mpirun with TREX_EP_WORKER=1 (and the mesh layout in TREX_EP_LAYOUT);
// the EpWorker tests then run on every rank and skip unless that variable is set. Worker checks use EXPECT only,
// so a mismatch never leaves a rank out of a collective.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace trex::ep_test {

inline bool worker_mode() { return std::getenv("TREX_EP_WORKER") != nullptr; }
inline std::string worker_layout() {
  const char* l = std::getenv("TREX_EP_LAYOUT");
  return l ? l : "";
}

// MPI is initialised once per process and finalised at exit.
inline comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> w = [] {
    auto c = comm::make_world_communicator("mpi");
    c->set_timeout_seconds(60);
    return c;
  }();
  return *w;
}

// ||a - b|| / ||b||, b the reference.
inline double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}
inline double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i])));
  return m;
}
// Equal to ~1e-5 relative (fp32, different summation orders); an all-zero reference needs an all-zero value.
inline void expect_close(const std::string& what, const float* got, const float* ref, int64_t n, double tol = 1e-5) {
  if (max_abs(ref, n) == 0.0) {
    EXPECT_EQ(max_abs(got, n), 0.0) << what << ": the reference is zero";
    return;
  }
  EXPECT_LT(rel_err(got, ref, n), tol) << what;
}

struct RunResult {
  int status;
  std::string output;
};
inline RunResult run_cmd(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  const int rc = p ? pclose(p) : -1;
  return {rc, out};
}
inline std::string self_path() {
  std::array<char, 4096> buf{};
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), size_t(n)) : std::string();
}

// Runs the EpWorker tests matching `filter` on np ranks with the mesh layout; every rank must run them (each prints
// "ep-worker ran" at the end) and pass.
inline void run_workers(int np, const std::string& layout, const std::string& filter) {
  ASSERT_EQ(run_cmd("command -v mpirun").status, 0) << "mpirun not found (scripts/setup.sh installs openmpi-bin)";
  const std::string cmd =
      "env TREX_EP_WORKER=1 TREX_EP_LAYOUT='" + layout +
      "' OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
      "OMPI_MCA_rmaps_base_oversubscribe=1 timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none "
      "-x TREX_EP_WORKER -x TREX_EP_LAYOUT -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS -np " +
      std::to_string(np) + " " + self_path() + " --gtest_filter='" + filter + "'";
  const RunResult r = run_cmd(cmd);
  EXPECT_EQ(r.status, 0) << layout << "\n" << r.output;
  size_t ran = 0;
  for (size_t p = r.output.find("ep-worker ran"); p != std::string::npos; p = r.output.find("ep-worker ran", p + 1))
    ++ran;
  EXPECT_EQ(ran, size_t(np)) << layout << "\n" << r.output;
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << layout << "\n" << r.output;
}

}  // namespace trex::ep_test
