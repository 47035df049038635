// Small models with optima known in closed form (worked out in the comments) or by brute-force
// enumeration, solved by every backend built in; statuses must match and objectives agree to 1e-6
// relative. Every returned point is checked against bounds/rows/integrality independently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;

namespace {

struct Case {
  const char* name;
  const char* lp;
  SolveStatus status;
  double objective;  // when Optimal
};

const Case kCases[] = {
    // x = 3, y = 1 (c2 and the bound are tight): 9 + 2 = 11.
    {"lp_max", "Maximize\n 3 x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x + 3 y <= 6\nBounds\n x <= 3\nEnd\n",
     SolveStatus::Optimal, 11},
    // z at its smallest (1), then x + y = 5, x - y = 1: x = 3, y = 2: 3 + 4 + 3 = 10.
    {"lp_equalities",
     "Minimize\n x + 2 y + 3 z\nSubject To\n e1: x + y + z = 6\n e2: x - y = 1\n g: z >= 1\nEnd\n",
     SolveStatus::Optimal, 10},
    // x + 2y = (x + y) + y >= -4 - 1, tight at y = -1, x = -3.
    {"lp_free_vars", "Minimize\n x + 2 y\nSubject To\n a: x + y >= -4\n b: y >= -1\nBounds\n x free\n y free\nEnd\n",
     SolveStatus::Optimal, -5},
    // Both at their upper bounds (-1, -2); row x - y = 1 <= 4 holds.
    {"lp_negative_bounds",
     "Maximize\n x + y\nSubject To\n r: x - y <= 4\nBounds\n -3 <= x <= -1\n -inf <= y <= -2\nEnd\n",
     SolveStatus::Optimal, -3},
    // Supply 1 (20) all to column 2 (saves 6 per unit against supply 2), supply 2 the rest:
    // 20*6 + 10*9 + 5*12 + 15*13 = 465.
    {"transportation",
     "Minimize\n 8 x11 + 6 x12 + 10 x13 + 9 x21 + 12 x22 + 13 x23\nSubject To\n s1: x11 + x12 + x13 = 20\n"
     " s2: x21 + x22 + x23 = 30\n d1: x11 + x21 >= 10\n d2: x12 + x22 >= 25\n d3: x13 + x23 >= 15\nEnd\n",
     SolveStatus::Optimal, 465},
    {"lp_infeasible", "Minimize\n x + y\nSubject To\n a: x + y <= 1\n b: x + y >= 2\nEnd\n", SolveStatus::Infeasible, 0},
    {"lp_unbounded", "Maximize\n x + y\nSubject To\n a: x - y <= 1\nEnd\n", SolveStatus::Unbounded, 0},
    // Objective constant: x = 2 -> 2 + 10.
    {"lp_constant", "Minimize\n x + 10\nSubject To\n a: x >= 2\nEnd\n", SolveStatus::Optimal, 12},
    // Gurobi-style constant pseudo-variable.
    {"lp_gurobi_constant", "Minimize\n x + 10 Constant\nSubject To\n a: x >= 2\nBounds\n Constant = 1\nEnd\n",
     SolveStatus::Optimal, 12},
    // Fixed variable x = 4, y >= x - 1 = 3: -4 + 3.
    {"lp_fixed", "Minimize\n - x + y\nSubject To\n a: y - x >= -1\nBounds\n x = 4\nEnd\n", SolveStatus::Optimal, -1},
    // LP optimum (3, 1.5) = 21; integer points: (4, 0) = 20 is best ((3,1) = 19, (2,2) = 18).
    {"milp_small",
     "Maximize\n 5 x + 4 y\nSubject To\n a: 6 x + 4 y <= 24\n b: x + 2 y <= 6\nGenerals\n x y\nEnd\n",
     SolveStatus::Optimal, 20},
    // Integer x <= 2.5 -> x <= 2 (cheaper), y = 1.5: 4 + 4.5.
    {"milp_mixed",
     "Minimize\n 2 x + 3 y\nSubject To\n a: x + y >= 3.5\n b: x <= 2.5\nGenerals\n x\nEnd\n", SolveStatus::Optimal,
     8.5},
    // 2x + 2y = 3 has real but no integer solutions (the relaxation is feasible).
    {"milp_infeasible", "Minimize\n x + y\nSubject To\n a: 2 x + 2 y = 3\nGenerals\n x y\nEnd\n",
     SolveStatus::Infeasible, 0},
    {"milp_unbounded", "Maximize\n x + y\nSubject To\n a: x - y <= 1.5\nGenerals\n x y\nEnd\n",
     SolveStatus::Unbounded, 0},
    // Binary knapsack (also checked by enumeration below): items 1, 3, 5 weigh 12, worth 26.
    {"knapsack",
     "Maximize\n 10 a + 13 b + 7 c + 8 d + 9 e\nSubject To\n w: 5 a + 6 b + 3 c + 4 d + 4 e <= 12\n"
     "Binaries\n a b c d e\nEnd\n",
     SolveStatus::Optimal, 26},
    // Convex QP: (x-2)^2 + (y-3)^2 - 13 over x + y <= 3: projection (1, 2) -> 1 + 1 - 13.
    {"qp_convex", "Minimize\n - 4 x - 6 y + [ 2 x ^ 2 + 2 y ^ 2 ] / 2\nSubject To\n a: x + y <= 3\nEnd\n",
     SolveStatus::Optimal, -11},
    // QCQP: max x + y on the disc of radius sqrt(2): (1, 1).
    {"qcqp", "Maximize\n x + y\nSubject To\n disc: [ x ^ 2 + y ^ 2 ] <= 2\nBounds\n x free\n y free\nEnd\n",
     SolveStatus::Optimal, 2},
    // MIQP: (x - 2.6)^2 + (y - 1.3)^2 over integers in [0, 5] -> (3, 1): 0.16 + 0.09.
    {"miqp", "Minimize\n - 5.2 x - 2.6 y + [ 2 x ^ 2 + 2 y ^ 2 ] / 2 + 8.45\nSubject To\n a: x + y <= 10\n"
             "Bounds\n x <= 5\n y <= 5\nGenerals\n x y\nEnd\n",
     SolveStatus::Optimal, 0.25},
};

bool supports(SolverKind k, const Model& m) {
  if (!solver_available(k)) return false;
  if (m.is_quadratic()) return k == SolverKind::Ipopt;
  if (k == SolverKind::Clp) return !m.has_integers();
  return true;
}

void check_result(const Case& c, const Model& m, const SolveResult& r, SolverKind k) {
  const std::string who = std::string(c.name) + " with " + solver_name(k) + ": " + r.message;
  ASSERT_EQ(status_name(r.status), std::string(status_name(c.status))) << who;
  if (c.status != SolveStatus::Optimal) {
    EXPECT_TRUE(r.values.empty()) << who;
    return;
  }
  ASSERT_EQ(r.values.size(), m.vars.size()) << who;
  EXPECT_NEAR(r.objective, c.objective, 1e-6 * std::max(1.0, std::abs(c.objective))) << who;
  const Violation v = max_violation(m, r.values);
  EXPECT_LT(v.max_abs, 1e-6) << who << " violates " << v.where;
  EXPECT_DOUBLE_EQ(r.objective, objective_value(m, r.values)) << who;
}

}  // namespace

TEST(SolveModels, EveryBackendAgreesWithKnownOptima) {
  ASSERT_FALSE(available_solvers().empty());
  int runs = 0;
  for (const Case& c : kCases) {
    const Model m = read_lp(c.lp, c.name);
    for (SolverKind k : {SolverKind::Cbc, SolverKind::Clp, SolverKind::Glpk, SolverKind::Ipopt}) {
      if (!supports(k, m)) continue;
      // Ipopt cannot prove unboundedness of MILPs or infeasibility over integers exactly; it is
      // exercised on the continuous cases and on the (convex) MIQP.
      if (k == SolverKind::Ipopt && m.has_integers() && !m.is_quadratic()) continue;
      SolveOptions o;
      o.solver = k;
      check_result(c, m, solve(m, o), k);
      ++runs;
    }
    SolveResult automatic = solve(m);
    EXPECT_EQ(automatic.status, c.status) << c.name << " (auto, " << automatic.solver << ")";
  }
  EXPECT_GE(runs, 30);
}

TEST(SolveModels, KnapsackMatchesEnumeration) {
  const int value[] = {10, 13, 7, 8, 9, 11, 4};
  const int weight[] = {5, 6, 3, 4, 4, 5, 2};
  const int cap = 15, n = 7;
  int best = 0;
  for (int mask = 0; mask < (1 << n); ++mask) {
    int w = 0, v = 0;
    for (int i = 0; i < n; ++i)
      if (mask >> i & 1) w += weight[i], v += value[i];
    if (w <= cap) best = std::max(best, v);
  }
  Model m;
  m.sense = Sense::Maximize;
  Constraint cap_row{"cap", {}, {}, RowSense::LE, double(cap)};
  for (int i = 0; i < n; ++i) {
    m.vars.push_back({"x" + std::to_string(i), 0, 1, VarType::Binary});
    m.objective.push_back({i, double(value[i])});
    cap_row.lin.push_back({i, double(weight[i])});
  }
  m.rows.push_back(cap_row);
  for (SolverKind k : {SolverKind::Cbc, SolverKind::Glpk}) {
    if (!solver_available(k)) continue;
    SolveOptions o;
    o.solver = k;
    const SolveResult r = solve(m, o);
    ASSERT_EQ(r.status, SolveStatus::Optimal) << solver_name(k);
    EXPECT_NEAR(r.objective, best, 1e-9) << solver_name(k);
  }
}

TEST(SolveModels, AssignmentMatchesEnumeration) {
  const double cost[4][4] = {{4, 2, 8, 5}, {4, 3, 7, 6}, {3, 1, 6, 2}, {9, 4, 3, 7}};
  int perm[4] = {0, 1, 2, 3};
  double best = 1e100;
  do {
    double c = 0;
    for (int i = 0; i < 4; ++i) c += cost[i][perm[i]];
    best = std::min(best, c);
  } while (std::next_permutation(perm, perm + 4));
  Model m;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      m.vars.push_back({"x" + std::to_string(i) + std::to_string(j), 0, 1, VarType::Binary});
      m.objective.push_back({i * 4 + j, cost[i][j]});
    }
  for (int i = 0; i < 4; ++i) {
    Constraint r{"row" + std::to_string(i), {}, {}, RowSense::EQ, 1}, c{"col" + std::to_string(i), {}, {}, RowSense::EQ, 1};
    for (int j = 0; j < 4; ++j) r.lin.push_back({i * 4 + j, 1}), c.lin.push_back({j * 4 + i, 1});
    m.rows.push_back(r);
    m.rows.push_back(c);
  }
  for (SolverKind k : {SolverKind::Cbc, SolverKind::Glpk}) {
    if (!solver_available(k)) continue;
    SolveOptions o;
    o.solver = k;
    const SolveResult r = solve(m, o);
    ASSERT_EQ(r.status, SolveStatus::Optimal);
    EXPECT_NEAR(r.objective, best, 1e-9) << solver_name(k);
  }
}

TEST(SolveModels, ContradictoryBoundsAreInfeasibleWithoutSolving) {
  Model m;
  m.vars.push_back({"x", 3, 2});
  m.objective.push_back({0, 1});
  const SolveResult r = solve(m);
  EXPECT_EQ(r.status, SolveStatus::Infeasible);
  EXPECT_NE(r.message.find("x"), std::string::npos);
  Model ints;
  ints.vars.push_back({"y", 0.2, 0.8, VarType::Integer});
  EXPECT_EQ(solve(ints).status, SolveStatus::Infeasible);
}

TEST(SolveModels, WrongBackendForModelClassIsAnError) {
  const Model q = read_lp("Minimize\n [ 2 x ^ 2 ] / 2\nSubject To\n a: x >= 1\nEnd\n");
  for (SolverKind k : {SolverKind::Cbc, SolverKind::Glpk}) {
    if (!solver_available(k)) continue;
    SolveOptions o;
    o.solver = k;
    const SolveResult r = solve(q, o);
    EXPECT_EQ(r.status, SolveStatus::Error);
    EXPECT_NE(r.message.find("quadratic"), std::string::npos) << r.message;
  }
  if (solver_available(SolverKind::Clp)) {
    const Model mi = read_lp("Minimize\n x\nSubject To\n a: x >= 1.5\nGenerals\n x\nEnd\n");
    SolveOptions o;
    o.solver = SolverKind::Clp;
    EXPECT_EQ(solve(mi, o).status, SolveStatus::Error);
  }
  EXPECT_THROW(parse_solver("gurobi"), trex::Error);
}

TEST(SolveModels, SolversStaySilent) {
  // CBC/CLP/GLPK/Ipopt print banners and logs to stdout by default; solve() must keep stdout clean
  // (the evaluator parses `trex solve --json` output).
  const Model m = read_lp(kCases[10].lp);
  const Model q = read_lp(kCases[15].lp);
  testing::internal::CaptureStdout();
  for (SolverKind k : available_solvers()) {
    SolveOptions o;
    o.solver = k;
    if (k == SolverKind::Ipopt) {
      solve(q, o);
    } else if (k != SolverKind::Clp) {
      solve(m, o);
    }
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "");
}

TEST(SolveModels, TimeLimitIsHonoured) {
  // A market-split instance (Cornuejols-Dawande): equality knapsacks with b = sum/2, notoriously hard
  // for branch and bound, so a 0.3 s limit must stop the search.
  Model m;
  unsigned s = 12345;
  auto next = [&] { return (s = s * 1103515245u + 12345u) >> 8; };
  const int n = 40, rows = 5;
  for (int j = 0; j < n; ++j) {
    m.vars.push_back({"x" + std::to_string(j), 0, 1, VarType::Binary});
  }
  for (int i = 0; i < rows; ++i) {
    Constraint r{"r" + std::to_string(i), {}, {}, RowSense::EQ, 0};
    double total = 0;
    for (int j = 0; j < n; ++j) {
      const double w = double(next() % 100);
      r.lin.push_back({j, w});
      total += w;
    }
    r.rhs = std::floor(total / 2);
    m.rows.push_back(r);
  }
  for (SolverKind k : {SolverKind::Cbc, SolverKind::Glpk}) {
    if (!solver_available(k)) continue;
    SolveOptions o;
    o.solver = k;
    o.time_limit_s = 0.3;
    const SolveResult r = solve(m, o);
    EXPECT_EQ(r.status, SolveStatus::Limit) << solver_name(k) << ": " << r.message;
    EXPECT_LT(r.seconds, 30.0) << solver_name(k);  // generous: the CI machine may be loaded
    if (!r.values.empty()) EXPECT_LT(max_violation(m, r.values).max_abs, 1e-6);
  }
}

TEST(SolveModels, ComplementarityRowsAreSolvedGlobally) {
  // LP optimum (3, 1) = 11 violates x * y = 0; the branches give x = 3 (9) or y = 3 (6): 9.
  const Model m = read_lp(
      "Maximize\n 3 x + 2 y\nSubject To\n a: x + y <= 4\n c: [ x * y ] = 0\nBounds\n x <= 3\n y <= 3\nEnd\n");
  for (SolverKind k : {SolverKind::Auto, SolverKind::Cbc, SolverKind::Clp, SolverKind::Glpk}) {
    if (!solver_available(k)) continue;
    SolveOptions o;
    o.solver = k;
    const SolveResult r = solve(m, o);
    ASSERT_EQ(r.status, SolveStatus::Optimal) << solver_name(k) << ": " << r.message;
    EXPECT_NEAR(r.objective, 9.0, 1e-9) << solver_name(k);
    EXPECT_LT(max_violation(m, r.values).max_abs, 1e-9) << solver_name(k);
  }
  // With integers and an infeasible combination: x + y >= 5 needs both positive.
  const Model inf = read_lp(
      "Maximize\n x + y\nSubject To\n a: x + y >= 5\n c: [ x * y ] <= 0\nBounds\n x <= 3\n y <= 3\nGenerals\n x\nEnd\n");
  EXPECT_EQ(solve(inf).status, SolveStatus::Infeasible);
}
