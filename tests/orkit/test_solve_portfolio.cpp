// The integer portfolio (CBC and GLPK raced in two processes): the first proven answer wins, the loser
// is killed, the winner is named; B4O-Feasible item 132 (a 3-variable integer knapsack on which CBC alone
// needs about a minute) is solved in under 2 s (test_eval_portfolio.cpp: and scored through `trex eval`).
#include <gtest/gtest.h>
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>

#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/solve/portfolio.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;
namespace fs = std::filesystem;

namespace {

// 19161 x0 = 17959 x1 + 10783 x2, x0 >= 4, all integer: min x0 = 114 (B4O-Feasible 132's data).
const char* kTokenExchange = R"(Minimize
 obj: x0
Subject To
 value: 19161 x0 - 17959 x1 - 10783 x2 = 0
Bounds
 x0 >= 4
Generals
 x0 x1 x2
End
)";

// Child processes of this process, from /proc (every thread's children list).
std::set<int> children() {
  std::set<int> out;
  const std::string task = "/proc/" + std::to_string(getpid()) + "/task";
  DIR* d = opendir(task.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(task + "/" + e->d_name + "/children");
    int pid;
    while (f >> pid) out.insert(pid);
  }
  closedir(d);
  return out;
}

bool both_solvers() { return solver_available(SolverKind::Cbc) && solver_available(SolverKind::Glpk); }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// CBC alone needs about a minute on this knapsack; the race is decided in well under a second when idle. The bound
// (a sixth of CBC's time) fails without the portfolio and holds on a loaded CI machine.
TEST(SolvePortfolio, KnapsackOnWhichCbcStallsIsProvedLongBeforeCbcAloneWould) {
  if (!both_solvers()) GTEST_SKIP() << "needs CBC and GLPK";
  const Model m = read_lp(kTokenExchange, "token.lp");
  ASSERT_TRUE(detail::uses_portfolio(m, SolveOptions{}));
  const std::set<int> before = children();
  const auto t0 = std::chrono::steady_clock::now();
  const SolveResult r = solve(m);
  const double secs = seconds_since(t0);
  EXPECT_LT(secs, 10.0) << r.message;
  ASSERT_EQ(r.status, SolveStatus::Optimal) << r.message;
  EXPECT_DOUBLE_EQ(r.objective, 114.0);
  ASSERT_EQ(r.values.size(), 3u);
  EXPECT_DOUBLE_EQ(19161 * r.values[0], 17959 * r.values[1] + 10783 * r.values[2]);
  EXPECT_TRUE(r.solver == "glpk" || r.solver == "cbc") << r.solver;
  EXPECT_NE(r.message.find("portfolio: " + r.solver + " proved it first"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("stopped"), std::string::npos) << "the loser is killed: " << r.message;
  EXPECT_EQ(children(), before) << "no solver process outlives the race";
}

TEST(SolvePortfolio, AgreesWithEachSolverOnSmallIntegerPrograms) {
  if (!both_solvers()) GTEST_SKIP() << "needs CBC and GLPK";
  // a knapsack, an infeasible parity model and an unbounded integer ray
  const char* models[] = {
      "Maximize\n 5 a + 4 b + 3 c\nSubject To\n w: 2 a + 3 b + c <= 5\n v: 4 a + b + 2 c <= 11\n"
      "Bounds\n a <= 3\n b <= 3\n c <= 3\nGenerals\n a b c\nEnd\n",
      "Minimize\n x\nSubject To\n even: 2 x - 2 y = 1\nBounds\n x <= 10\n y <= 10\nGenerals\n x y\nEnd\n",
      "Maximize\n x + y\nSubject To\n c: x - y <= 2\nGenerals\n x\nEnd\n"};
  const SolveStatus expected[] = {SolveStatus::Optimal, SolveStatus::Infeasible, SolveStatus::Unbounded};
  for (int i = 0; i < 3; ++i) {
    const Model m = read_lp(models[i], "m" + std::to_string(i));
    const SolveResult raced = solve(m);
    EXPECT_EQ(raced.status, expected[i]) << i << " " << raced.message;
    for (SolverKind k : {SolverKind::Cbc, SolverKind::Glpk}) {
      SolveOptions o;
      o.solver = k;
      const SolveResult alone = solve(m, o);
      EXPECT_EQ(alone.status, raced.status) << i << " " << solver_name(k) << " " << alone.message;
      if (alone.status == SolveStatus::Optimal) EXPECT_NEAR(alone.objective, raced.objective, 1e-9) << i;
    }
  }
  SolveOptions off;
  off.portfolio = false;
  EXPECT_FALSE(detail::uses_portfolio(read_lp(models[0], "m0"), off));
  EXPECT_EQ(solve(read_lp(models[0], "m0"), off).solver, "cbc");  // Auto without the race: CBC
  EXPECT_FALSE(detail::uses_portfolio(read_lp("Minimize\n x\nSubject To\n c: x >= 1\nEnd\n", "lp"), {}));
}

TEST(SolvePortfolio, TimeLimitStopsBothSolvers) {
  if (!both_solvers()) GTEST_SKIP() << "needs CBC and GLPK";
  // A hard equality knapsack (no solution: the gcd of the weights is 2 and the right-hand side odd is
  // not spotted by plain branching); a 0.3 s limit must end the race in about that long.
  std::string lp = "Minimize\n obj: x0\nSubject To\n c: ";
  for (int j = 0; j < 40; ++j) lp += (j ? " + " : "") + std::to_string(2 * (1000 + 37 * j)) + " x" + std::to_string(j);
  lp += " = 100001\nBounds\n";
  for (int j = 0; j < 40; ++j) lp += " x" + std::to_string(j) + " <= 50\n";
  lp += "Generals\n";
  for (int j = 0; j < 40; ++j) lp += " x" + std::to_string(j);
  lp += "\nEnd\n";
  const Model m = read_lp(lp, "hard.lp");
  SolveOptions o;
  o.time_limit_s = 0.3;
  const std::set<int> before = children();
  const auto t0 = std::chrono::steady_clock::now();
  const SolveResult r = solve(m, o);
  EXPECT_LT(seconds_since(t0), 3.0) << r.message;
  EXPECT_NE(r.status, SolveStatus::Optimal);
  EXPECT_EQ(children(), before);
}
