// The JSON form of a solve, as `trex solve --json` prints it (one object, one line, on stdout):
//
//   {
//     "status":    "optimal" | "infeasible" | "unbounded" | "infeasible_or_unbounded" | "limit" | "error",
//     "objective": number | null,     // null unless a solution exists; includes the objective constant
//     "values":    {"<variable name>": number, ...},   // every variable (keys sorted); {} without a solution
//     "solver":    "cbc" | "clp" | "glpk" | "ipopt" | "",   // "" when no solver ran (e.g. a parse error)
//     "seconds":   number,            // wall time of the solve alone (reading the file excluded)
//     "message":   string,            // detail: the error text for "error", the reason for a limit, ...
//     "problem_class": "LP" | "MILP" | "QP" | "MIQP" | "",  // QP also covers quadratic rows (QCQP)
//     "num_vars":  int, "num_rows": int
//   }
//
// Numbers are printed with 17 significant digits (exact round trip). "limit" may carry values
// (a feasible, not proven optimal point) or not. The exit code of `trex solve` is 0 whenever a solver
// ran (whatever its status) and 1 for bad input (then status is "error" and solver is "").
#pragma once
#include <nlohmann/json.hpp>

#include "orkit/lp/model.h"

namespace trex::orkit {

const char* problem_class(const Model& model);  // "LP", "MILP", "QP", "MIQP"
nlohmann::json result_to_json(const Model& model, const SolveResult& result);
// For failures before a model exists (unreadable file, syntax error).
nlohmann::json error_json(const std::string& message);

}  // namespace trex::orkit
