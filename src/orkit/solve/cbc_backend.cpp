// COIN-OR backends: CLP (OsiClpSolverInterface) for LPs and relaxations, CBC through CbcMain0/CbcMain1
// (the same driver as the `cbc` binary, so its default cuts and heuristics run) for MILPs.
#include <cmath>
#include <string>
#include <vector>

#include "orkit/lp/model_util.h"
#include "orkit/solve/backends.h"

#ifdef TREX_HAVE_CBC
#include <CbcModel.hpp>
#include <ClpSimplex.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>
#endif

namespace trex::orkit::detail {

#ifndef TREX_HAVE_CBC

SolveResult solve_cbc(const Model&, const SolveOptions&) {
  SolveResult r;
  r.solver = "cbc";
  r.message = "CBC was not built into this trex";
  return r;
}
SolveResult solve_clp(const Model&, const SolveOptions&) {
  SolveResult r;
  r.solver = "clp";
  r.message = "CLP was not built into this trex";
  return r;
}

#else

namespace {

// Loads the linear part of `model` (minimisation form: a Maximize objective is negated).
void load(const Model& model, OsiClpSolverInterface& si, bool with_integers) {
  const int n = static_cast<int>(model.vars.size());
  const int m = static_cast<int>(model.rows.size());
  const double inf = si.getInfinity();
  auto fin = [inf](double v) { return v == kInf ? inf : v == -kInf ? -inf : v; };
  std::vector<double> collb(n), colub(n), obj(n, 0.0), rowlb(m), rowub(m);
  for (int j = 0; j < n; ++j) {
    const Variable& v = model.vars[j];
    double lb = v.lb, ub = v.ub;
    if (v.type == VarType::Binary) lb = std::max(lb, 0.0), ub = std::min(ub, 1.0);
    collb[j] = fin(lb);
    colub[j] = fin(ub);
  }
  const double s = model.sense == Sense::Maximize ? -1.0 : 1.0;
  for (const auto& t : model.objective) obj[t.var] += s * t.coef;
  // Row-major triplets; duplicates within a row are summed by merging first.
  std::vector<int> rows, cols;
  std::vector<double> vals;
  for (int i = 0; i < m; ++i) {
    const Constraint& r = model.rows[i];
    std::vector<LinTerm> lin = r.lin;
    merge_duplicate_terms(lin);
    for (const auto& t : lin) {
      if (t.coef == 0.0) continue;
      rows.push_back(i);
      cols.push_back(t.var);
      vals.push_back(t.coef);
    }
    rowlb[i] = r.sense == RowSense::LE ? -inf : fin(r.rhs);
    rowub[i] = r.sense == RowSense::GE ? inf : fin(r.rhs);
  }
  CoinPackedMatrix matrix(true, rows.data(), cols.data(), vals.data(), static_cast<CoinBigIndex>(vals.size()));
  matrix.setDimensions(m, n);
  si.loadProblem(matrix, collb.data(), colub.data(), obj.data(), rowlb.data(), rowub.data());
  // No column names: with column names but no row names, CLP's presolve (run again by CbcMain1 after
  // the search) crashes in CBC 2.10.
  for (int j = 0; j < n; ++j)
    if (with_integers && model.vars[j].type != VarType::Continuous) si.setInteger(j);
}

void quiet(OsiClpSolverInterface& si, bool verbose) {
  si.messageHandler()->setLogLevel(verbose ? 1 : 0);
  si.getModelPtr()->setLogLevel(verbose ? 1 : 0);
}

enum class LpOutcome { Optimal, Infeasible, DualInfeasible, Limit, Error };

LpOutcome solve_lp(OsiClpSolverInterface& si, const SolveOptions& o) {
  if (o.time_limit_s > 0) si.getModelPtr()->setMaximumSeconds(o.time_limit_s);
  si.initialSolve();
  if (si.isProvenOptimal()) return LpOutcome::Optimal;
  if (si.isProvenPrimalInfeasible()) return LpOutcome::Infeasible;
  if (si.isProvenDualInfeasible()) return LpOutcome::DualInfeasible;
  if (si.isIterationLimitReached() || si.getModelPtr()->hitMaximumIterations() ||
      si.getModelPtr()->status() == 3)
    return LpOutcome::Limit;
  return LpOutcome::Error;
}

// Is the LP (continuous) feasible? Used after a dual-infeasible answer.
LpOutcome lp_feasibility(const Model& model, const SolveOptions& o) {
  OsiClpSolverInterface si;
  quiet(si, o.verbose);
  load(zero_objective(model), si, false);
  return solve_lp(si, o);
}

struct MipRun {
  enum { Optimal, Infeasible, Feasible, Limit, Unbounded, Error } outcome = Error;
  std::vector<double> x;
  std::string detail;
};

MipRun run_cbc(const Model& model, const SolveOptions& o) {
  OsiClpSolverInterface si;
  quiet(si, o.verbose);
  load(model, si, true);
  CbcModel cbc(si);
  MipRun out;
  {
    StdoutSilencer silence(!o.verbose);
    CbcMain0(cbc);
    cbc.setLogLevel(o.verbose ? 1 : 0);
    std::vector<std::string> args = {"trex", "-log", o.verbose ? "1" : "0"};
    // Wall-clock limit (CBC counts CPU seconds by default).
    if (o.time_limit_s > 0) args.insert(args.end(), {"-timeMode", "elapsed", "-sec", std::to_string(o.time_limit_s)});
    args.insert(args.end(), {"-ratio", std::to_string(std::max(0.0, o.mip_gap))});
    args.insert(args.end(), {"-solve", "-quit"});
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    CbcMain1(static_cast<int>(argv.size()), argv.data(), cbc);
  }
  const int n = static_cast<int>(model.vars.size());
  const double* best = cbc.bestSolution();
  if (best && cbc.getSolutionCount() > 0) {
    out.x.assign(best, best + n);
  } else if (cbc.status() == 0 && !cbc.isProvenInfeasible() && cbc.solver() &&
             cbc.solver()->getNumCols() == n && cbc.solver()->isProvenOptimal()) {
    // When preprocessing removes every integer column, the driver reports the answer only in the LP
    // solver; take it if it really is integer feasible.
    const double* x = cbc.solver()->getColSolution();
    std::vector<double> cand(x, x + n);
    for (int j = 0; j < n; ++j)
      if (model.vars[j].type != VarType::Continuous) cand[j] = std::round(cand[j]);
    if (max_violation(model, cand).max_abs < 1e-6) {
      out.x = std::move(cand);
      out.outcome = MipRun::Optimal;
      return out;
    }
  }
  if (cbc.isProvenOptimal() && !out.x.empty()) {
    out.outcome = MipRun::Optimal;
  } else if (cbc.isProvenInfeasible()) {
    out.outcome = MipRun::Infeasible;
  } else if (cbc.isContinuousUnbounded() || cbc.isProvenDualInfeasible()) {
    out.outcome = MipRun::Unbounded;
  } else if (cbc.isSecondsLimitReached() || cbc.isNodeLimitReached() || cbc.isSolutionLimitReached()) {
    out.outcome = out.x.empty() ? MipRun::Limit : MipRun::Feasible;
  } else {
    out.outcome = MipRun::Error;
    out.detail = "cbc status " + std::to_string(cbc.status()) + ", secondary " + std::to_string(cbc.secondaryStatus());
  }
  return out;
}

}  // namespace

SolveResult solve_clp(const Model& model, const SolveOptions& o) {
  SolveResult res;
  res.solver = "clp";
  OsiClpSolverInterface si;
  quiet(si, o.verbose);
  load(model, si, false);
  LpOutcome lp;
  {
    StdoutSilencer silence(!o.verbose);
    lp = solve_lp(si, o);
    if (lp == LpOutcome::DualInfeasible) {
      // Dual infeasible means unbounded only if a primal feasible point exists.
      const LpOutcome probe = lp_feasibility(model, o);
      lp = probe == LpOutcome::Optimal      ? LpOutcome::DualInfeasible
           : probe == LpOutcome::Infeasible ? LpOutcome::Infeasible
                                            : LpOutcome::Error;
      if (lp == LpOutcome::DualInfeasible) {
        res.status = SolveStatus::Unbounded;
        res.message = "clp: unbounded (dual infeasible, primal feasible)";
        return res;
      }
    }
  }
  switch (lp) {
    case LpOutcome::Optimal: {
      res.status = SolveStatus::Optimal;
      const double* x = si.getColSolution();
      res.values.assign(x, x + model.vars.size());
      break;
    }
    case LpOutcome::Infeasible:
      res.status = SolveStatus::Infeasible;
      res.message = "clp: primal infeasible";
      break;
    case LpOutcome::Limit:
      res.status = SolveStatus::Limit;
      res.message = "clp: stopped by the time/iteration limit";
      break;
    default:
      res.status = SolveStatus::Error;
      res.message = "clp: solve failed (status " + std::to_string(si.getModelPtr()->status()) + ")";
  }
  return res;
}

SolveResult solve_cbc(const Model& model, const SolveOptions& o) {
  if (!model.has_integers()) {
    SolveResult r = solve_clp(model, o);
    r.solver = "cbc";
    return r;
  }
  SolveResult res;
  res.solver = "cbc";
  // The LP relaxation first: it settles infeasible relaxations at once and tells whether an
  // unbounded-looking MIP needs the feasibility probe.
  LpOutcome relax;
  {
    StdoutSilencer silence(!o.verbose);
    OsiClpSolverInterface si;
    quiet(si, o.verbose);
    load(model, si, false);
    relax = solve_lp(si, o);
  }
  if (relax == LpOutcome::Infeasible) {
    res.status = SolveStatus::Infeasible;
    res.message = "cbc: LP relaxation infeasible";
    return res;
  }
  if (relax == LpOutcome::DualInfeasible) {
    // Relaxation unbounded (or infeasible): the MIP is unbounded iff it has a feasible point
    // (rational data), so search for any integer-feasible point.
    MipRun probe = run_cbc(zero_objective(model), o);
    if (!probe.x.empty()) {
      res.status = SolveStatus::Unbounded;
      res.message = "cbc: unbounded (relaxation unbounded, integer feasible point exists)";
    } else if (probe.outcome == MipRun::Infeasible) {
      res.status = SolveStatus::Infeasible;
      res.message = "cbc: integer infeasible";
    } else {
      res.status = SolveStatus::InfeasibleOrUnbounded;
      res.message = "cbc: relaxation unbounded; feasibility not settled within the limits";
    }
    return res;
  }
  MipRun run = run_cbc(model, o);
  switch (run.outcome) {
    case MipRun::Optimal:
      res.status = SolveStatus::Optimal;
      res.values = std::move(run.x);
      break;
    case MipRun::Infeasible:
      res.status = SolveStatus::Infeasible;
      res.message = "cbc: integer infeasible";
      break;
    case MipRun::Unbounded:
      res.status = SolveStatus::Unbounded;
      res.message = "cbc: unbounded";
      break;
    case MipRun::Feasible:
      res.status = SolveStatus::Limit;
      res.values = std::move(run.x);
      res.message = "cbc: limit reached with a feasible solution (not proven optimal)";
      break;
    case MipRun::Limit:
      res.status = SolveStatus::Limit;
      res.message = "cbc: limit reached without a feasible solution";
      break;
    case MipRun::Error:
      res.status = SolveStatus::Error;
      res.message = "cbc: " + run.detail;
      break;
  }
  return res;
}

#endif

}  // namespace trex::orkit::detail
