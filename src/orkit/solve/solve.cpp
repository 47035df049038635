#include "orkit/solve/solve.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/backends.h"
#include "orkit/solve/portfolio.h"

namespace trex::orkit {

const char* solver_name(SolverKind kind) {
  switch (kind) {
    case SolverKind::Auto: return "auto";
    case SolverKind::Cbc: return "cbc";
    case SolverKind::Clp: return "clp";
    case SolverKind::Glpk: return "glpk";
    case SolverKind::Ipopt: return "ipopt";
  }
  return "auto";
}

SolverKind parse_solver(std::string_view name) {
  for (auto k : {SolverKind::Auto, SolverKind::Cbc, SolverKind::Clp, SolverKind::Glpk, SolverKind::Ipopt})
    if (name == solver_name(k)) return k;
  fail("unknown solver '{}' (expected auto, cbc, clp, glpk or ipopt)", name);
}

bool solver_available(SolverKind kind) {
  switch (kind) {
    case SolverKind::Auto: return !available_solvers().empty();
    case SolverKind::Cbc:
    case SolverKind::Clp:
#ifdef TREX_HAVE_CBC
      return true;
#else
      return false;
#endif
    case SolverKind::Glpk:
#ifdef TREX_HAVE_GLPK
      return true;
#else
      return false;
#endif
    case SolverKind::Ipopt:
#ifdef TREX_HAVE_IPOPT
      return true;
#else
      return false;
#endif
  }
  return false;
}

std::vector<SolverKind> available_solvers() {
  std::vector<SolverKind> out;
  for (auto k : {SolverKind::Cbc, SolverKind::Clp, SolverKind::Glpk, SolverKind::Ipopt})
    if (solver_available(k)) out.push_back(k);
  return out;
}

SolverKind choose_solver(const Model& model, SolverKind requested) {
  if (requested != SolverKind::Auto) {
    TREX_CHECK(solver_available(requested), "solver '{}' was not built into this trex (available: {})",
               solver_name(requested), [] {
                 std::string s;
                 for (auto k : available_solvers()) s += std::string(s.empty() ? "" : ", ") + solver_name(k);
                 return s.empty() ? std::string("none") : s;
               }());
    return requested;
  }
  const bool quad = model.is_quadratic(), ints = model.has_integers();
  if (quad) {
    TREX_CHECK(solver_available(SolverKind::Ipopt), "quadratic model needs Ipopt, which was not built in");
    return SolverKind::Ipopt;
  }
  if (ints) {
    if (solver_available(SolverKind::Cbc)) return SolverKind::Cbc;
    if (solver_available(SolverKind::Glpk)) return SolverKind::Glpk;
    fail("MILP needs CBC or GLPK, neither was built in");
  }
  if (solver_available(SolverKind::Clp)) return SolverKind::Clp;
  if (solver_available(SolverKind::Glpk)) return SolverKind::Glpk;
  if (solver_available(SolverKind::Ipopt)) return SolverKind::Ipopt;
  fail("no LP solver was built in (CBC/CLP, GLPK, Ipopt all missing)");
}

namespace {

// Structural validity is a caller bug (throws); contradictory bounds are a property of the model
// (reported as Infeasible without calling a solver).
void validate(const Model& m) {
  const int n = static_cast<int>(m.vars.size());
  auto check_var = [&](int j, const char* where) {
    TREX_CHECK(j >= 0 && j < n, "model: {} refers to variable index {} (model has {})", where, j, n);
  };
  auto check_num = [&](double v, const std::string& where) {
    TREX_CHECK(std::isfinite(v), "model: {} has a non-finite coefficient {}", where, v);
  };
  TREX_CHECK(std::isfinite(m.objective_constant), "model: objective constant is {}", m.objective_constant);
  for (const auto& t : m.objective) check_var(t.var, "objective"), check_num(t.coef, "objective");
  for (const auto& q : m.objective_quad)
    check_var(q.i, "objective"), check_var(q.j, "objective"), check_num(q.coef, "objective");
  for (const auto& r : m.rows) {
    for (const auto& t : r.lin) check_var(t.var, "a row"), check_num(t.coef, "row " + r.name);
    for (const auto& q : r.quad) check_var(q.i, "a row"), check_var(q.j, "a row"), check_num(q.coef, "row " + r.name);
    TREX_CHECK(!std::isnan(r.rhs), "model: row {} has a NaN right-hand side", r.name);
  }
  for (const auto& v : m.vars) TREX_CHECK(!std::isnan(v.lb) && !std::isnan(v.ub), "model: variable {} has a NaN bound", v.name);
}

std::string contradiction(const Model& m) {
  for (const auto& v : m.vars) {
    double lb = v.lb, ub = v.ub;
    if (v.type == VarType::Binary) lb = std::max(lb, 0.0), ub = std::min(ub, 1.0);
    if (v.type != VarType::Continuous) lb = std::ceil(lb - 1e-9), ub = std::floor(ub + 1e-9);
    if (lb > ub) return "variable " + v.name + " has lower bound > upper bound";
    if (lb == kInf || ub == -kInf) return "variable " + v.name + " has an infinite lower bound above its upper";
  }
  for (const auto& r : m.rows) {
    if ((r.sense == RowSense::EQ && std::isinf(r.rhs)) || (r.sense == RowSense::LE && r.rhs == -kInf) ||
        (r.sense == RowSense::GE && r.rhs == kInf))
      return "row " + r.name + " has an unsatisfiable infinite right-hand side";
  }
  return {};
}

}  // namespace

SolveResult solve(const Model& model, const SolveOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(model);
  if (options.solver != SolverKind::Ipopt && model.is_quadratic() && detail::is_complementarity_model(model)) {
    Model linear = model;
    for (auto& r : linear.rows) r.quad.clear();
    const SolverKind lin = choose_solver(linear, options.solver == SolverKind::Clp && linear.has_integers()
                                                    ? SolverKind::Cbc
                                                    : options.solver);
    if (lin != SolverKind::Ipopt) {
      SolveResult res = detail::solve_complementarity(model, options, lin);
      if (!res.values.empty()) res.objective = objective_value(model, res.values);
      res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return res;
    }
  }
  const SolverKind kind = choose_solver(model, options.solver);
  SolveResult res;
  const std::string bad = contradiction(model);
  if (!bad.empty()) {
    res.status = SolveStatus::Infeasible;
    res.solver = solver_name(kind);
    res.message = bad;
  } else if (detail::uses_portfolio(model, options)) {
    res = detail::solve_portfolio(model, options, {SolverKind::Cbc, SolverKind::Glpk});
  } else {
    const bool quad = model.is_quadratic(), ints = model.has_integers();
    if (quad && kind != SolverKind::Ipopt) {
      res.solver = solver_name(kind);
      res.message = std::string(solver_name(kind)) + " does not handle quadratic terms (use ipopt)";
    } else if (kind == SolverKind::Clp && ints) {
      res.solver = "clp";
      res.message = "clp solves LPs only; this model has integer variables (use cbc or glpk)";
    } else {
      switch (kind) {
        case SolverKind::Cbc: res = detail::solve_cbc(model, options); break;
        case SolverKind::Clp: res = detail::solve_clp(model, options); break;
        case SolverKind::Glpk: res = detail::solve_glpk(model, options); break;
        case SolverKind::Ipopt:
          res = ints ? detail::solve_miqp_bnb(model, options) : detail::solve_ipopt(model, options);
          break;
        case SolverKind::Auto: TREX_ASSERT(false);
      }
    }
  }
  if (!res.values.empty()) {
    TREX_ASSERT(res.values.size() == model.vars.size());
    res.objective = objective_value(model, res.values);
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

namespace detail {

Model zero_objective(const Model& model) {
  Model m = model;
  m.objective.clear();
  m.objective_quad.clear();
  m.objective_constant = 0.0;
  return m;
}

StdoutSilencer::StdoutSilencer(bool active) {
  if (!active) return;
  std::fflush(stdout);
  saved_ = dup(1);
  const int null_fd = open("/dev/null", O_WRONLY);
  if (saved_ < 0 || null_fd < 0) {
    if (null_fd >= 0) close(null_fd);
    if (saved_ >= 0) close(saved_);
    saved_ = -1;
    return;
  }
  dup2(null_fd, 1);
  close(null_fd);
}

StdoutSilencer::~StdoutSilencer() {
  if (saved_ < 0) return;
  std::fflush(stdout);
  dup2(saved_, 1);
  close(saved_);
}

}  // namespace detail
}  // namespace trex::orkit
