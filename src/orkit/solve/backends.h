// Internal: the backends behind solve(). Each is defined whether or not its library was found (then it
// returns status Error "not built"). Inputs are validated by solve() first: indices in range, finite
// coefficients, lb <= ub, binaries within [0, 1].
#pragma once
#include "orkit/lp/model.h"
#include "orkit/solve/solve.h"

namespace trex::orkit::detail {

SolveResult solve_cbc(const Model& model, const SolveOptions& options);  // LP and MILP (CLP for the LPs)
SolveResult solve_clp(const Model& model, const SolveOptions& options);  // LP only
SolveResult solve_glpk(const Model& model, const SolveOptions& options);  // LP and MILP
SolveResult solve_ipopt(const Model& model, const SolveOptions& options);  // continuous, (QC)QP
SolveResult solve_miqp_bnb(const Model& model, const SolveOptions& options);  // integers + quadratic

// Models whose only quadratic terms are complementarity rows `x_i * x_j = 0` (or <= 0) over x >= 0:
// solved exactly by branching x_i = 0 / x_j = 0 over a linear backend (`linear`).
bool is_complementarity_model(const Model& model);
SolveResult solve_complementarity(const Model& model, const SolveOptions& options, SolverKind linear);

// Copy of `model` with every objective coefficient (and the quadratic part) set to zero: the
// feasibility probe used to tell "infeasible" from "unbounded".
Model zero_objective(const Model& model);

// Redirects stdout (fd 1) to /dev/null for its lifetime when `active`; the COIN-OR libraries print
// banners through C++ streams and printf that their log levels do not all cover.
class StdoutSilencer {
 public:
  explicit StdoutSilencer(bool active);
  ~StdoutSilencer();
  StdoutSilencer(const StdoutSilencer&) = delete;
  StdoutSilencer& operator=(const StdoutSilencer&) = delete;

 private:
  int saved_ = -1;
};

}  // namespace trex::orkit::detail
