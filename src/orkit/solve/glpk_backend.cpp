// GLPK backend: glp_simplex (presolve on) for LPs, glp_intopt (MIP presolve on) for MILPs.
#include "orkit/solve/glpk_model.h"

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "orkit/lp/model_util.h"
#include "orkit/solve/backends.h"

namespace trex::orkit {

#ifdef TREX_HAVE_GLPK

glp_prob* build_glpk_problem(const Model& model) {
  glp_prob* P = glp_create_prob();
  const int n = static_cast<int>(model.vars.size());
  const int m = static_cast<int>(model.rows.size());
  glp_set_obj_dir(P, model.sense == Sense::Minimize ? GLP_MIN : GLP_MAX);
  if (n > 0) glp_add_cols(P, n);
  if (m > 0) glp_add_rows(P, m);
  for (int j = 0; j < n; ++j) {
    const Variable& v = model.vars[j];
    double lb = v.lb, ub = v.ub;
    if (v.type == VarType::Binary) lb = std::max(lb, 0.0), ub = std::min(ub, 1.0);
    const bool has_lb = std::isfinite(lb), has_ub = std::isfinite(ub);
    const int type = has_lb && has_ub ? (lb == ub ? GLP_FX : GLP_DB) : has_lb ? GLP_LO : has_ub ? GLP_UP : GLP_FR;
    glp_set_col_bnds(P, j + 1, type, has_lb ? lb : 0.0, has_ub ? ub : 0.0);
    if (v.type != VarType::Continuous) glp_set_col_kind(P, j + 1, GLP_IV);
  }
  for (const auto& t : model.objective) glp_set_obj_coef(P, t.var + 1, glp_get_obj_coef(P, t.var + 1) + t.coef);
  glp_set_obj_coef(P, 0, model.objective_constant);
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0.0};
  for (int i = 0; i < m; ++i) {
    const Constraint& r = model.rows[i];
    const bool finite = std::isfinite(r.rhs);
    int type = r.sense == RowSense::LE ? GLP_UP : r.sense == RowSense::GE ? GLP_LO : GLP_FX;
    if (!finite) type = GLP_FR;  // +inf for <=, -inf for >= (contradictions are caught by solve())
    glp_set_row_bnds(P, i + 1, type, finite ? r.rhs : 0.0, finite ? r.rhs : 0.0);
    std::vector<LinTerm> lin = r.lin;
    merge_duplicate_terms(lin);  // glp_load_matrix rejects duplicate (row, column) pairs
    for (const auto& t : lin) {
      if (t.coef == 0.0) continue;
      ia.push_back(i + 1);
      ja.push_back(t.var + 1);
      ar.push_back(t.coef);
    }
  }
  glp_load_matrix(P, static_cast<int>(ar.size()) - 1, ia.data(), ja.data(), ar.data());
  return P;
}

Model model_from_glpk(glp_prob* P) {
  Model model;
  if (const char* name = glp_get_prob_name(P)) model.name = name;
  model.sense = glp_get_obj_dir(P) == GLP_MAX ? Sense::Maximize : Sense::Minimize;
  model.objective_constant = glp_get_obj_coef(P, 0);
  const int n = glp_get_num_cols(P), m = glp_get_num_rows(P);
  for (int j = 1; j <= n; ++j) {
    Variable v;
    const char* name = glp_get_col_name(P, j);
    v.name = name ? std::string(name) : fmt::format("x{}", j);
    const int type = glp_get_col_type(P, j);
    v.lb = (type == GLP_LO || type == GLP_DB || type == GLP_FX) ? glp_get_col_lb(P, j) : -kInf;
    v.ub = (type == GLP_UP || type == GLP_DB || type == GLP_FX) ? glp_get_col_ub(P, j) : kInf;
    const int kind = glp_get_col_kind(P, j);
    v.type = kind == GLP_BV ? VarType::Binary : kind == GLP_IV ? VarType::Integer : VarType::Continuous;
    if (v.type == VarType::Integer && v.lb == 0.0 && v.ub == 1.0) v.type = VarType::Binary;
    model.vars.push_back(v);
    const double c = glp_get_obj_coef(P, j);
    if (c != 0.0) model.objective.push_back({j - 1, c});
  }
  std::vector<int> ind(n + 1);
  std::vector<double> val(n + 1);
  for (int i = 1; i <= m; ++i) {
    const int type = glp_get_row_type(P, i);
    const char* name = glp_get_row_name(P, i);
    const int len = glp_get_mat_row(P, i, ind.data(), val.data());
    Constraint row;
    row.name = name ? std::string(name) : fmt::format("R{}", i - 1);
    for (int k = 1; k <= len; ++k) row.lin.push_back({ind[k] - 1, val[k]});
    if (type == GLP_FR) continue;  // a free row constrains nothing (MathProg emits the objective as one)
    if (type == GLP_FX) {
      row.sense = RowSense::EQ;
      row.rhs = glp_get_row_lb(P, i);
      model.rows.push_back(std::move(row));
      continue;
    }
    if (type == GLP_LO || type == GLP_DB) {
      Constraint lo = row;
      lo.sense = RowSense::GE;
      lo.rhs = glp_get_row_lb(P, i);
      if (type == GLP_DB) lo.name += "_lo";
      model.rows.push_back(std::move(lo));
    }
    if (type == GLP_UP || type == GLP_DB) {
      row.sense = RowSense::LE;
      row.rhs = glp_get_row_ub(P, i);
      if (type == GLP_DB) row.name += "_hi";
      model.rows.push_back(std::move(row));
    }
  }
  return model;
}

namespace {

struct TermOutGuard {
  explicit TermOutGuard(bool verbose) : prev(glp_term_out(verbose ? GLP_ON : GLP_OFF)) {}
  ~TermOutGuard() { glp_term_out(prev); }
  int prev;
};

struct ProbGuard {
  glp_prob* p;
  ~ProbGuard() {
    if (p) glp_delete_prob(p);
  }
};

int time_limit_ms(const SolveOptions& o) {
  if (o.time_limit_s <= 0) return INT32_MAX;
  return static_cast<int>(std::min(o.time_limit_s * 1000.0, 2.0e9));
}

// true: primal feasible (LP), false: infeasible; throws nothing. `undecided` set when GLPK gave up.
bool lp_feasible(const Model& model, const SolveOptions& o, bool* undecided) {
  ProbGuard g{build_glpk_problem(detail::zero_objective(model))};
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = o.verbose ? GLP_MSG_ON : GLP_MSG_OFF;
  parm.presolve = GLP_OFF;
  parm.tm_lim = time_limit_ms(o);
  const int ret = glp_simplex(g.p, &parm);
  *undecided = false;
  if (ret == GLP_ENOPFS) return false;
  if (ret != 0) {
    *undecided = true;
    return false;
  }
  const int st = glp_get_status(g.p);
  if (st == GLP_OPT || st == GLP_FEAS || st == GLP_UNBND) return true;
  if (st == GLP_NOFEAS) return false;
  *undecided = true;
  return false;
}

enum class MipOutcome { Optimal, Feasible, Infeasible, Limit, RelaxationUnbounded, Error };

MipOutcome run_intopt(glp_prob* P, const SolveOptions& o, std::string* detail) {
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.msg_lev = o.verbose ? GLP_MSG_ON : GLP_MSG_OFF;
  parm.presolve = GLP_ON;
  parm.tm_lim = time_limit_ms(o);
  parm.mip_gap = std::max(0.0, o.mip_gap);
  parm.gmi_cuts = GLP_ON;
  parm.mir_cuts = GLP_ON;
  const int ret = glp_intopt(P, &parm);
  const int st = glp_mip_status(P);
  switch (ret) {
    case 0:
      if (st == GLP_OPT) return MipOutcome::Optimal;
      if (st == GLP_NOFEAS) return MipOutcome::Infeasible;
      if (st == GLP_FEAS) return MipOutcome::Feasible;
      break;
    case GLP_ENOPFS: return MipOutcome::Infeasible;
    case GLP_ENODFS: return MipOutcome::RelaxationUnbounded;
    case GLP_EMIPGAP: return st == GLP_FEAS || st == GLP_OPT ? MipOutcome::Optimal : MipOutcome::Limit;
    case GLP_ETMLIM:
    case GLP_ESTOP: return st == GLP_FEAS ? MipOutcome::Feasible : MipOutcome::Limit;
    default: break;
  }
  *detail = "glp_intopt returned " + std::to_string(ret) + ", mip status " + std::to_string(st);
  return MipOutcome::Error;
}

}  // namespace

namespace detail {

SolveResult solve_glpk(const Model& model, const SolveOptions& o) {
  ProbGuard g{build_glpk_problem(model)};
  return solve_glpk_problem(g.p, model, o);
}

SolveResult solve_glpk_problem(glp_prob* problem, const Model& model, const SolveOptions& o) {
  SolveResult res;
  res.solver = "glpk";
  TermOutGuard term(o.verbose);
  const struct {
    glp_prob* p;
  } g{problem};  // borrowed
  const int n = static_cast<int>(model.vars.size());
  if (!model.has_integers()) {
    glp_smcp parm;
    glp_init_smcp(&parm);
    parm.msg_lev = o.verbose ? GLP_MSG_ON : GLP_MSG_OFF;
    parm.presolve = GLP_ON;
    parm.tm_lim = time_limit_ms(o);
    int ret = glp_simplex(g.p, &parm);
    int st = ret == 0 ? glp_get_status(g.p) : GLP_UNDEF;
    bool dual_infeasible = ret == GLP_ENODFS || (ret == 0 && st == GLP_UNBND);
    if (ret == 0 && st == GLP_OPT) {
      res.status = SolveStatus::Optimal;
      for (int j = 1; j <= n; ++j) res.values.push_back(glp_get_col_prim(g.p, j));
    } else if (ret == GLP_ENOPFS || (ret == 0 && st == GLP_NOFEAS)) {
      res.status = SolveStatus::Infeasible;
      res.message = "glpk: no primal feasible solution";
    } else if (dual_infeasible) {
      bool undecided = false;
      const bool feasible = lp_feasible(model, o, &undecided);
      res.status = undecided  ? SolveStatus::InfeasibleOrUnbounded
                   : feasible ? SolveStatus::Unbounded
                              : SolveStatus::Infeasible;
      res.message = feasible ? "glpk: unbounded (dual infeasible, primal feasible)" : "glpk: infeasible";
    } else if (ret == GLP_ETMLIM || ret == GLP_EITLIM) {
      res.status = SolveStatus::Limit;
      res.message = "glpk: time/iteration limit";
    } else {
      res.message = "glpk: glp_simplex returned " + std::to_string(ret) + ", status " + std::to_string(st);
    }
    return res;
  }
  std::string detail;
  const MipOutcome out = run_intopt(g.p, o, &detail);
  auto take_values = [&] {
    for (int j = 1; j <= n; ++j) res.values.push_back(glp_mip_col_val(g.p, j));
  };
  switch (out) {
    case MipOutcome::Optimal:
      res.status = SolveStatus::Optimal;
      take_values();
      break;
    case MipOutcome::Feasible:
      res.status = SolveStatus::Limit;
      res.message = "glpk: limit reached with a feasible solution (not proven optimal)";
      take_values();
      break;
    case MipOutcome::Infeasible:
      res.status = SolveStatus::Infeasible;
      res.message = "glpk: integer infeasible";
      break;
    case MipOutcome::Limit:
      res.status = SolveStatus::Limit;
      res.message = "glpk: limit reached without a feasible solution";
      break;
    case MipOutcome::RelaxationUnbounded: {
      ProbGuard probe{build_glpk_problem(detail::zero_objective(model))};
      std::string probe_detail;
      const MipOutcome p = run_intopt(probe.p, o, &probe_detail);
      if (p == MipOutcome::Optimal || p == MipOutcome::Feasible) {
        res.status = SolveStatus::Unbounded;
        res.message = "glpk: unbounded (relaxation unbounded, integer feasible point exists)";
      } else if (p == MipOutcome::Infeasible) {
        res.status = SolveStatus::Infeasible;
        res.message = "glpk: integer infeasible";
      } else {
        res.status = SolveStatus::InfeasibleOrUnbounded;
        res.message = "glpk: relaxation unbounded; feasibility not settled (" + probe_detail + ")";
      }
      break;
    }
    case MipOutcome::Error: res.message = "glpk: " + detail; break;
  }
  return res;
}

}  // namespace detail

#else

namespace detail {
SolveResult solve_glpk(const Model&, const SolveOptions&) {
  SolveResult r;
  r.solver = "glpk";
  r.message = "GLPK was not built into this trex";
  return r;
}
}  // namespace detail

#endif

}  // namespace trex::orkit
