// Cross-checks: CBC vs GLPK vs exhaustive enumeration on random small MILPs (fixed seeds), LP write ->
// read -> solve invariance, and GNU MathProg through GLPK's translator.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "core/error.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/mathprog.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;

namespace {

// Random bounded integer program: n integer vars in [lo, hi], m rows of mixed sense. May be infeasible.
Model random_milp(std::mt19937& rng, int n, int m, int lo, int hi) {
  std::uniform_int_distribution<int> coef(-9, 9), sense(0, 2), rhs(-10, 30), flip(0, 1);
  Model model;
  model.sense = flip(rng) ? Sense::Maximize : Sense::Minimize;
  for (int j = 0; j < n; ++j) {
    model.vars.push_back({"x" + std::to_string(j), double(lo), double(hi), VarType::Integer});
    model.objective.push_back({j, double(coef(rng))});
  }
  for (int i = 0; i < m; ++i) {
    Constraint r{"r" + std::to_string(i), {}, {}, static_cast<RowSense>(sense(rng)), double(rhs(rng))};
    for (int j = 0; j < n; ++j)
      if (int c = coef(rng); c != 0) r.lin.push_back({j, double(c)});
    if (r.sense == RowSense::EQ) r.sense = RowSense::LE;  // keep most instances feasible
    model.rows.push_back(r);
  }
  model.objective_constant = double(rhs(rng));
  return model;
}

// Exhaustive optimum over the integer box; nullopt when infeasible.
std::optional<double> enumerate(const Model& m) {
  const int n = static_cast<int>(m.vars.size());
  std::vector<double> x(n);
  for (int j = 0; j < n; ++j) x[j] = m.vars[j].lb;
  std::optional<double> best;
  while (true) {
    if (max_violation(m, x).max_abs <= 1e-9) {
      const double v = objective_value(m, x);
      if (!best || (m.sense == Sense::Minimize ? v < *best : v > *best)) best = v;
    }
    int j = 0;
    while (j < n && x[j] >= m.vars[j].ub) x[j] = m.vars[j].lb, ++j;
    if (j == n) break;
    x[j] += 1;
  }
  return best;
}

}  // namespace

TEST(SolveCross, RandomSmallMilpsMatchEnumeration) {
  std::mt19937 rng(2024);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Model m = random_milp(rng, 4, 3, -2, 3);  // 6^4 = 1296 points
    const std::optional<double> truth = enumerate(m);
    (truth ? feasible : infeasible)++;
    for (SolverKind k : {SolverKind::Cbc, SolverKind::Glpk}) {
      if (!solver_available(k)) continue;
      SolveOptions o;
      o.solver = k;
      const SolveResult r = solve(m, o);
      if (!truth) {
        EXPECT_EQ(r.status, SolveStatus::Infeasible) << "trial " << trial << " " << solver_name(k) << "\n"
                                                     << write_lp(m);
        continue;
      }
      ASSERT_EQ(r.status, SolveStatus::Optimal) << "trial " << trial << " " << solver_name(k) << ": " << r.message
                                                << "\n" << write_lp(m);
      EXPECT_NEAR(r.objective, *truth, 1e-6 * std::max(1.0, std::abs(*truth)))
          << "trial " << trial << " " << solver_name(k);
      EXPECT_LT(max_violation(m, r.values).max_abs, 1e-6);
    }
  }
  EXPECT_GT(feasible, 10);  // the generator must exercise both outcomes
  EXPECT_GT(infeasible, 0);
}

TEST(SolveCross, CbcAndGlpkAgreeOnMediumMilps) {
  if (!solver_available(SolverKind::Cbc) || !solver_available(SolverKind::Glpk)) GTEST_SKIP();
  std::mt19937 rng(99);
  int compared = 0;
  for (int trial = 0; trial < 12; ++trial) {
    Model m = random_milp(rng, 10, 7, 0, 20);
    // Half of the variables continuous: a real mixed-integer model.
    for (size_t j = 0; j < m.vars.size(); j += 2) m.vars[j].type = VarType::Continuous;
    SolveOptions oc, og;
    oc.solver = SolverKind::Cbc;
    og.solver = SolverKind::Glpk;
    const SolveResult a = solve(m, oc), b = solve(m, og);
    ASSERT_EQ(a.status, b.status) << "trial " << trial << ": cbc " << a.message << " / glpk " << b.message;
    if (a.status != SolveStatus::Optimal) continue;
    EXPECT_NEAR(a.objective, b.objective, 1e-6 * std::max(1.0, std::abs(a.objective))) << "trial " << trial;
    ++compared;
  }
  EXPECT_GE(compared, 6);
}

TEST(SolveCross, LpRoundTripKeepsTheOptimum) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 10; ++trial) {
    Model m = random_milp(rng, 8, 6, -5, 10);
    for (auto& v : m.vars) v.type = VarType::Continuous;
    m.vars[0].lb = -kInf;
    const SolveResult a = solve(m);
    const SolveResult b = solve(read_lp(write_lp(m)));
    ASSERT_EQ(a.status, b.status);
    if (a.status == SolveStatus::Optimal) EXPECT_NEAR(a.objective, b.objective, 1e-9 * std::max(1.0, std::abs(a.objective)));
  }
}

TEST(MathProg, SolvesAndConvertsAModelWithData) {
  if (!solver_available(SolverKind::Glpk)) GTEST_SKIP() << "GLPK not built in";
  // Transportation problem (same data as the LP case in test_solve_models: optimum 465).
  const char* model = R"(
set I; set J;
param supply{I}; param demand{J}; param cost{I, J};
var x{I, J} >= 0;
minimize total: sum{i in I, j in J} cost[i, j] * x[i, j];
s.t. sup{i in I}: sum{j in J} x[i, j] = supply[i];
s.t. dem{j in J}: sum{i in I} x[i, j] >= demand[j];
solve;
printf "shipped %g\n", sum{i in I, j in J} x[i, j];
end;
)";
  const char* data = R"(
data;
set I := s1 s2; set J := d1 d2 d3;
param supply := s1 20 s2 30;
param demand := d1 10 d2 25 d3 15;
param cost: d1 d2 d3 := s1 8 6 10 s2 9 12 13;
end;
)";
  const MathProgResult r = solve_mathprog(model, data);
  ASSERT_EQ(r.result.status, SolveStatus::Optimal) << r.result.message << r.output;
  EXPECT_NEAR(r.result.objective, 465, 1e-9);
  EXPECT_NE(r.output.find("shipped 50"), std::string::npos) << r.output;  // postsolve ran
  EXPECT_EQ(r.model.vars.size(), 6u);
  EXPECT_EQ(r.model.rows.size(), 5u);
  EXPECT_GE(find_var(r.model, "x[s1,d2]"), 0);
  // The converted model solves to the same optimum with every LP backend, also after an LP round trip.
  const Model converted = mathprog_to_model(model, data);
  for (SolverKind k : available_solvers()) {
    SolveOptions o;
    o.solver = k;
    const SolveResult s = solve(read_lp(write_lp(converted)), o);
    ASSERT_EQ(s.status, SolveStatus::Optimal) << solver_name(k);
    EXPECT_NEAR(s.objective, 465, 465e-6) << solver_name(k);  // 1e-6 relative (Ipopt is an interior point method)
  }
}

TEST(MathProg, IntegerModelAndErrors) {
  if (!solver_available(SolverKind::Glpk)) GTEST_SKIP() << "GLPK not built in";
  const MathProgResult r =
      solve_mathprog("var x integer >= 0; var y integer >= 0;\nmaximize z: 5*x + 4*y;\n"
                     "s.t. a: 6*x + 4*y <= 24;\ns.t. b: x + 2*y <= 6;\nend;\n");
  ASSERT_EQ(r.result.status, SolveStatus::Optimal);
  EXPECT_NEAR(r.result.objective, 20, 1e-9);
  const MathProgResult inf = solve_mathprog("var x >= 0;\nminimize z: x;\ns.t. a: x <= -1;\nend;\n");
  EXPECT_EQ(inf.result.status, SolveStatus::Infeasible);
  try {
    solve_mathprog("var x >= 0;\nminimize z: x +* 2;\nend;\n", {}, {}, "broken.mod");
    FAIL() << "no error";
  } catch (const trex::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("broken.mod:2"), std::string::npos) << what;
  }
}
