// The integer-program portfolio: CBC and GLPK solve the same model at once, each in its own forked
// process; the first to prove its answer (optimal, infeasible or unbounded) wins and the other is killed
// (SIGKILL), so one solver's bad day on a model (CBC takes 54 s on a 3-variable knapsack GLPK proves in
// 0.2 s) does not hold up the caller. When neither proves anything, the more informative answer is kept
// (a feasible point under a limit over none; a limit over an error). The result names the winner in
// `solver` and the race in `message`.
//
// Processes, not threads: a solver cannot be interrupted safely mid-call, a process can be killed.
// The children only run the backend and write the result to a pipe, then _exit (no atexit handlers,
// no flush of the parent's stdio buffers); their stdout/stderr go to /dev/null unless verbose, and they
// die with the parent (PR_SET_PDEATHSIG). With a time limit the parent also kills both children a
// second after it has passed.
#pragma once
#include <vector>

#include "orkit/lp/model.h"
#include "orkit/solve/solve.h"

namespace trex::orkit::detail {

// Races `solvers` (each a concrete linear backend that handles integers: Cbc, Glpk) on `model`.
SolveResult solve_portfolio(const Model& model, const SolveOptions& options, const std::vector<SolverKind>& solvers);

// Whether solve() with these options races a portfolio on this model: solver Auto, options.portfolio,
// integer variables, no quadratic terms, and both CBC and GLPK built in.
bool uses_portfolio(const Model& model, const SolveOptions& options);

}  // namespace trex::orkit::detail
