// Conversion between trex::orkit::Model and GLPK's glp_prob (only with TREX_HAVE_GLPK). Quadratic
// terms cannot be represented in GLPK and are ignored by build_glpk_problem (solve() never passes them).
#pragma once
#ifdef TREX_HAVE_GLPK
#include <glpk.h>

#include "orkit/lp/model.h"
#include "orkit/solve/solve.h"

namespace trex::orkit {

// Caller owns the result (glp_delete_prob). Binaries become GLP_IV columns with bounds [0, 1].
glp_prob* build_glpk_problem(const Model& model);
// Rows: free rows are dropped (MathProg emits the objective as one); a double-bounded row becomes
// two rows `<name>_lo` (>=) and `<name>_hi` (<=). The objective constant is kept.
Model model_from_glpk(glp_prob* problem);

namespace detail {
// Solves `problem` in place with GLPK (the caller keeps ownership); `model` must describe the same
// problem (used for the zero-objective feasibility probe). Values come from `problem`'s columns.
SolveResult solve_glpk_problem(glp_prob* problem, const Model& model, const SolveOptions& options);
}  // namespace detail

}  // namespace trex::orkit
#endif
