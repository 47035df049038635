// Mean-variance portfolio (a convex QP): minimise the variance x' S x of a fully invested, long-only
// portfolio with a minimum expected return and a cap per asset. Route 1 writes the quadratic objective
// term by term from the covariance matrix; route 2 (MathProg is linear only) is a separately built model:
// the Cholesky factor S = L L' turns the variance into a sum of squares sum_k y_k^2 with y = L' x, and
// Ipopt solves that model. Both routes must agree within the verification tolerance.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

double g(const json& j) {
  return j.get<double>();
}

// Lower-triangular Cholesky factor of the covariance in the data; fails when it is not positive definite.
std::vector<std::vector<double>> cholesky(const std::vector<std::vector<double>>& s) {
  const size_t n = s.size();
  std::vector<std::vector<double>> l(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double v = s[i][j];
      for (size_t k = 0; k < j; ++k) v -= l[i][k] * l[j][k];
      if (i == j) {
        TREX_CHECK(v > 1e-9, "portfolio covariance is not positive definite (pivot {} = {})", i, v);
        l[i][i] = std::sqrt(v);
      } else {
        l[i][j] = v / l[j][j];
      }
    }
  return l;
}

Instance portfolio(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> pool = {
      "ACME", "BOLT", "CRUX", "DYNA", "EVER", "FLUX", "GRID", "HALO", "IONX", "JADE", "KILN",
      "LUMA", "MINT", "NOVA", "ORCA", "PIKE", "QUAD", "RUNE", "SAGE", "TIDE", "UNIX", "VOLT",
      "WAVE", "XENO", "YARN", "ZEST", "ARCH", "BRIX", "CORE", "DUNE", "ECHO", "FERN"};
  const int n = size_for(rng, req.difficulty, 3, 4, 5, 8, 10, 15, 20, 30);
  auto A = rng.sample(pool, n);
  Instance in;
  in.family = "portfolio";
  in.problem_class = "QP";
  in.difficulty = req.difficulty;
  in.objective_unit = "squared percent (variance of the annual return)";
  json& d = in.data;
  d["assets"] = A;
  std::vector<double> mu(n);
  for (int i = 0; i < n; ++i) d["expected_return"][A[i]] = mu[i] = rng.real(2, 15, 0.1);
  // Covariance from two market factors plus idiosyncratic variance, rounded to 0.1 (%^2): diagonally
  // dominant enough that rounding keeps it positive definite (route 2 checks by factorising it).
  std::vector<std::array<double, 2>> beta(n);
  std::vector<double> idio(n);
  for (int i = 0; i < n; ++i) {
    beta[i] = {rng.real(2, 12, 0.1), rng.real(-6, 6, 0.1)};
    idio[i] = rng.real(20, 300, 1);
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const double s = beta[i][0] * beta[j][0] + beta[i][1] * beta[j][1] + (i == j ? idio[i] : 0.0);
      d["covariance"][A[i]][A[j]] = std::round(s * 10) / 10;
    }
  const double cap = std::max(std::ceil(100.0 / n + 1) / 100, rng.real(0.25, 0.6, 0.05));
  d["max_weight"] = cap;
  std::vector<double> sorted = mu;
  std::sort(sorted.rbegin(), sorted.rend());
  double best = 0, left = 1.0;
  for (double m : sorted) {
    const double w = std::min(cap, left);
    best += w * m;
    left -= w;
  }
  double avg = 0;
  for (double m : mu) avg += m / n;
  if (req.target == Expected::Infeasible) {
    d["target_return"] = std::ceil((best + rng.real(0.3, 2.0, 0.1)) * 10) / 10;
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format(
        "with at most {}% in any asset the highest attainable expected return is {}%, "
        "below the {}% target",
        num(cap * 100), num(std::round(best * 1000) / 1000), num(g(d["target_return"])));
  } else {
    d["target_return"] = std::floor((avg + rng.real(0.1, 0.7, 0.01) * (best - avg)) * 10) / 10;
  }
  static const std::vector<std::string> who = {"A pension fund", "A family office", "A university endowment",
                                               "A robo-adviser", "An insurance company's treasury"};
  in.story = fmt::format(
      "{} invests in {} assets ({}). It wants the long-only, fully invested portfolio with the smallest "
      "variance of "
      "annual return (Markowitz) whose expected return reaches a target, with no more than a fixed share of "
      "the "
      "capital in any single asset. Returns are in percent per year and the covariance matrix in squared "
      "percent.",
      rng.pick(who), n, join_and(A));
  std::string inl;
  std::vector<std::string> rets;
  for (auto& a : A) rets.push_back(fmt::format("{} {}%", a, num(g(d["expected_return"][a]))));
  inl += "Expected annual returns: " + join_and(rets) + ". ";
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> row;
    for (int j = i; j < n; ++j)
      row.push_back(j == i
                        ? fmt::format("variance of {} is {}", A[i], num(g(d["covariance"][A[i]][A[j]])))
                        : fmt::format("covariance with {} is {}", A[j], num(g(d["covariance"][A[i]][A[j]]))));
    inl += capitalize(join_and(row)) + ". ";
  }
  inl += fmt::format("The target expected return is {}% and at most {}% may go into any one asset.",
                     num(g(d["target_return"])), num(cap * 100));
  in.inline_data = inl;
  Table t1{"Expected annual return (%):", {"Asset", "Return"}, {}};
  for (auto& a : A) t1.rows.push_back({a, num(g(d["expected_return"][a]))});
  Table t2{"Covariance matrix (%^2):", {""}, {}};
  for (auto& a : A) t2.header.push_back(a);
  for (auto& a : A) {
    std::vector<std::string> row{a};
    for (auto& b : A) row.push_back(num(g(d["covariance"][a][b])));
    t2.rows.push_back(row);
  }
  in.tables = {t1, t2};
  in.table_lead = fmt::format("Target expected return: {}%. Maximum weight per asset: {}.",
                              num(g(d["target_return"])), num(cap));
  in.question = "Which portfolio weights minimise the variance? Report the minimum variance.";
  in.data_keys = {{"assets", "list of assets"},
                  {"expected_return", "expected annual return in percent"},
                  {"covariance", "covariance[a][b] in squared percent (symmetric)"},
                  {"target_return", "minimum expected return of the portfolio (percent)"},
                  {"max_weight", "largest fraction of capital in one asset"}};
  // Route 1: the quadratic form written term by term (x_i x_j once per unordered pair).
  ModelBuilder mb("portfolio", Sense::Minimize);
  std::vector<int> x;
  for (auto& a : A) x.push_back(mb.var("w_" + a, 0, cap));
  for (int i = 0; i < n; ++i)
    for (int j = i; j < n; ++j) {
      const double s = g(d["covariance"][A[i]][A[j]]);
      mb.obj_quad(x[i], x[j], i == j ? s : 2 * s);
    }
  const int rb = mb.row("budget", RowSense::EQ, 1);
  const int rr = mb.row("target", RowSense::GE, g(d["target_return"]));
  for (int i = 0; i < n; ++i) {
    mb.add(rb, x[i], 1);
    mb.add(rr, x[i], mu[i]);
  }
  in.model = mb.take();
  // Route 2: sum of squares through the Cholesky factor of the covariance, computed from the data.
  {
    std::vector<std::vector<double>> s(n, std::vector<double>(n));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) s[i][j] = g(d["covariance"][A[i]][A[j]]);
    const auto l = cholesky(s);
    Model m2;
    m2.name = "portfolio_factor";
    m2.sense = Sense::Minimize;
    for (int i = 0; i < n; ++i)
      m2.vars.push_back({"x" + std::to_string(i), 0.0, g(d["max_weight"]), VarType::Continuous});
    for (int k = 0; k < n; ++k) {
      const int yk = static_cast<int>(m2.vars.size());
      m2.vars.push_back({"y" + std::to_string(k), -kInf, kInf, VarType::Continuous});
      m2.objective_quad.push_back({yk, yk, 1.0});
      Constraint r{"factor" + std::to_string(k), {{yk, -1.0}}, {}, RowSense::EQ, 0.0};
      for (int i = k; i < n; ++i) r.lin.push_back({i, l[i][k]});  // y_k = sum_i L_ik x_i
      m2.rows.push_back(std::move(r));
    }
    Constraint sum{"invest", {}, {}, RowSense::EQ, 1.0},
        ret{"return", {}, {}, RowSense::GE, g(d["target_return"])};
    for (int i = 0; i < n; ++i) {
      sum.lin.push_back({i, 1.0});
      ret.lin.push_back({i, g(d["expected_return"][A[i]])});
    }
    m2.rows.push_back(std::move(sum));
    m2.rows.push_back(std::move(ret));
    in.route2_model = std::move(m2);
  }
  in.mathprog = "";  // GLPK cannot solve a quadratic objective; route 2 is route2_model
  in.formulation = R"(Sets:
- A: assets.
Parameters:
- mu_a: expected return (%); S_(a,b): covariance (%^2); R: target return; u: maximum weight.
Decision variables:
- x_a: fraction of capital in asset a, 0 <= x_a <= u, continuous.
Objective:
- minimize sum_(a in A) sum_(b in A) S_(a,b) * x_a * x_b   (portfolio variance, convex since S is PSD)
Constraints:
- fully invested: sum_a x_a = 1
- return target: sum_a mu_a * x_a >= R)";
  in.python_body = R"(A = data["assets"]
S = data["covariance"]
model = gp.Model("portfolio")
x = model.addVars(A, lb=0, ub=data["max_weight"], name="w")
model.setObjective(gp.quicksum(S[a][b] * x[a] * x[b] for a in A for b in A), GRB.MINIMIZE)
model.addConstr(x.sum() == 1, name="budget")
model.addConstr(gp.quicksum(data["expected_return"][a] * x[a] for a in A) >= data["target_return"], name="target")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Markowitz minimum-variance portfolio over {} assets: a convex quadratic program.", n),
      {"Continuous weights x_a in [0, max weight] (long-only, concentration cap).",
       "Objective: the variance x' S x, written as a double sum over the covariance matrix.",
       "Linear constraints: weights sum to 1 and the expected return reaches the target.",
       "S is positive semidefinite, so any local optimum is global."});
  return in;
}

}  // namespace

void add_portfolio_families(std::vector<Family>& out) {
  out.push_back({"portfolio", "portfolio_budget", true, false, &portfolio});
}

}  // namespace trex::orkit::gen
