// Small helpers over trex::orkit::Model that every user of the OR toolkit needs: name lookup,
// evaluating the objective and checking a point against bounds / rows / integrality (what the data
// generator's "double verification" and the tests use as an invariant independent of any solver).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "orkit/lp/model.h"

namespace trex::orkit {

// Index of the variable called `name`, or -1.
int find_var(const Model& model, std::string_view name);
// Index of the row called `name`, or -1.
int find_row(const Model& model, std::string_view name);

// objective_constant + c'x + sum q_ij x_i x_j at `x` (one value per variable).
double objective_value(const Model& model, const std::vector<double>& x);
// Activity (left-hand side) of one row at `x`, quadratic part included.
double row_activity(const Constraint& row, const std::vector<double>& x);

struct Violation {
  double max_abs = 0.0;  // largest absolute violation over bounds, rows and integrality
  std::string where;     // "row c1", "bound x", "integrality y" (empty when max_abs == 0)
};
// Absolute violations; integrality counts distance to the nearest integer.
Violation max_violation(const Model& model, const std::vector<double>& x);

// Sums duplicate linear terms and duplicate (unordered) quadratic pairs, in first-seen order.
void merge_duplicate_terms(std::vector<LinTerm>& lin);
void merge_duplicate_terms(std::vector<QuadTerm>& quad);

// "optimal", "infeasible", "unbounded", "infeasible_or_unbounded", "limit", "error".
const char* status_name(SolveStatus status);
// Parses status_name() output back; throws trex::Error on anything else.
SolveStatus parse_status(std::string_view name);

}  // namespace trex::orkit
