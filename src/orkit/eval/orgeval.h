// Bench4Opt-ORGEval's structural equivalence of two LP models (arXiv 2510.27610, as implemented in the
// T-Rex harness; see design/trex-report.md §1.6): normalise (single-variable rows become bounds — with the
// reference's sign quirk and bound replacement —, zero-RHS rows are oriented), compare variable and
// linear-row counts, build the bipartite variable/constraint graph with float32 "%.6f" features, run
// Weisfeiler-Lehman colour refinement on each graph, require equal colour sets, and require both graphs
// to pass the sufficient condition (every colour class a singleton, or symmetric-decomposable).
// Quadratic rows, quadratic objective terms, the objective sense and constant are not represented.
#pragma once
#include <string>

#include "orkit/lp/model.h"

namespace trex::orkit::eval {

struct EquivalenceVerdict {
  bool equivalent = false;
  // "equivalent", "var_count_mismatch", "constraint_count_mismatch", "wl_graph_mismatch",
  // "reference_not_certifiable", "candidate_not_certifiable"
  std::string reason;
  int reference_vars = 0, candidate_vars = 0, reference_rows = 0, candidate_rows = 0;
  int wl_rounds_reference = 0, wl_rounds_candidate = 0;
};

EquivalenceVerdict check_lp_equivalence(const Model& reference, const Model& candidate);

}  // namespace trex::orkit::eval
