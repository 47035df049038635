// Multi-process checks: `trex comm test` under mpirun with 2 and 4 ranks, several layouts, and the
// failure behaviour (a hung rank makes the job stop within the time-out, with a message).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct RunResult {
  int status;
  std::string output;
  double seconds;
};

RunResult run(const std::string& cmd) {
  auto start = std::chrono::steady_clock::now();
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  int rc = p ? pclose(p) : -1;
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {rc, out, s};
}

std::string mpirun(int np) {
  // Root in CI; oversubscribe the 2-core machine; no CMA single-copy (not allowed in containers).
  return "env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
         "mpirun --allow-run-as-root --oversubscribe --bind-to none -np " +
         std::to_string(np) + " " + TREX_BINARY + " comm test";
}

bool have_mpirun() { return run("command -v mpirun").status == 0; }

}  // namespace

TEST(CommMpi, TwoRanksExpertParallel) {
  ASSERT_TRUE(have_mpirun()) << "mpirun not found (scripts/setup.sh installs openmpi-bin)";
  auto r = run(mpirun(2));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"pass\": true"), std::string::npos) << r.output;
}

TEST(CommMpi, FourRanksFoldedLayouts) {
  ASSERT_TRUE(have_mpirun());
  for (const char* layout : {"dp=4,ep=4", "dp=4,ep=2", "pp=2,dp=2,ep=2", "pp=4,dp=1,ep=1"}) {
    auto r = run(mpirun(4) + " --layout " + layout + " --experts 8 --topk 3");
    EXPECT_EQ(r.status, 0) << layout << "\n" << r.output;
    EXPECT_NE(r.output.find("\"pass\": true"), std::string::npos) << layout << "\n" << r.output;
  }
}

TEST(CommMpi, ImpossibleLayoutIsRefused) {
  ASSERT_TRUE(have_mpirun());
  auto r = run(mpirun(2) + " --layout dp=2,ep=2 --experts 7");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("does not divide the 7 routed experts"), std::string::npos) << r.output;
  r = run(mpirun(2) + " --layout pp=1,dp=3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("but 2 processes were launched"), std::string::npos) << r.output;
}

TEST(CommMpi, HungRankStopsTheJobWithinTimeout) {
  ASSERT_TRUE(have_mpirun());
  auto r = run("timeout 60 " + mpirun(2) + " --hang-rank 1 --timeout 3");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_LT(r.seconds, 40.0) << r.output;
  EXPECT_NE(r.output.find("did not complete within 3.0 s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0"), std::string::npos) << r.output;
}
