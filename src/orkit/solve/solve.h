// One entry point for every open solver: solve(model, options) -> SolveResult.
//
//   solver  Auto picks by model class among the backends built in: LP -> clp (else glpk), MILP -> cbc
//           and glpk raced (the first proven answer wins, the other is killed; one of them alone when
//           the other is not built in or options.portfolio is off), continuous quadratic (QP/QCQP) -> ipopt, mixed-integer quadratic -> branch and
//           bound over ipopt (see below).
//   status  Optimal / Infeasible / Unbounded are only reported when the backend proved them; an
//           "infeasible or unbounded" answer from presolve or from an unbounded LP relaxation is settled by
//           a second solve with a zero objective (feasible -> Unbounded, else Infeasible). Limit: the time
//           limit stopped the solve (values present iff a feasible point was found).
//   values  one per model variable (Model::vars order) whenever a solution exists.
//   objective  always recomputed from the values with objective_value() (constant included), so every
//           backend reports it the same way.
// Complementarity rows (x_i * x_j = 0 or <= 0 over x >= 0, the only quadratic terms) are solved exactly
// by branching over a linear backend (solver auto/cbc/clp/glpk). Ipopt is a local NLP method: for non-convex quadratics "optimal" means a local optimum (the message
// says so). Mixed-integer quadratic models are solved by a depth-first branch and bound over Ipopt
// relaxations (exact for convex MIQPs, heuristic otherwise; node limit in SolveOptions).
// Solver logs are silenced unless verbose (CBC/CLP/GLPK/Ipopt print to stdout otherwise).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "orkit/lp/model.h"

namespace trex::orkit {

enum class SolverKind { Auto, Cbc, Clp, Glpk, Ipopt };

struct SolveOptions {
  SolverKind solver = SolverKind::Auto;
  double time_limit_s = 0.0;  // <= 0: none
  double mip_gap = 0.0;       // relative gap at which a MIP counts as solved (0: prove optimality)
  int threads = 1;
  bool verbose = false;
  int miqp_node_limit = 10000;  // branch-and-bound nodes for mixed-integer quadratic models
  // With solver Auto, integer programs (no quadratic terms) are raced between CBC and GLPK in two
  // processes; the first proven answer wins and `SolveResult::solver` names it (see portfolio.h).
  bool portfolio = true;
};

SolveResult solve(const Model& model, const SolveOptions& options = {});

const char* solver_name(SolverKind kind);           // "auto", "cbc", "clp", "glpk", "ipopt"
SolverKind parse_solver(std::string_view name);     // throws trex::Error naming the choices
bool solver_available(SolverKind kind);             // compiled in (Auto: any)
std::vector<SolverKind> available_solvers();        // concrete backends compiled in
// The backend Auto resolves to for this model (throws trex::Error when none can handle it).
SolverKind choose_solver(const Model& model, SolverKind requested);

}  // namespace trex::orkit
