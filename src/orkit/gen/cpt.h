// Solver-verified worked-example documents for continued pre-training: the problem, its formulation,
// the code, the solver's result explained (model size, status, objective, solution, binding constraints)
// and a sensitivity note (LP: shadow price measured by re-solving with one right-hand side moved) or the
// reason for infeasibility / unboundedness.
#pragma once
#include <optional>
#include <string>

#include "orkit/gen/instance.h"
#include "orkit/gen/render.h"
#include "orkit/gen/rng.h"
#include "orkit/gen/verify.h"

namespace trex::orkit::gen {

struct Sensitivity {
  std::string row;       // the binding row whose right-hand side was moved
  double delta = 1.0;    // by how much
  double new_objective = 0.0;
};

// Re-solves the verified LP with one binding row's rhs moved by +delta (LP instances only).
std::optional<Sensitivity> measure_sensitivity(const Verdict& v, Rng& rng);

std::string worked_example(const Instance& inst, const Verdict& v, Representation rep,
                           const std::optional<Sensitivity>& sens, Rng& rng);

}  // namespace trex::orkit::gen
