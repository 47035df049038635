// Two independent solves of every instance. Route 1: the C++-built Model written as a CPLEX LP file,
// read back by the LP reader, solved by CBC (Ipopt for quadratic models). Route 2: the family's own
// MathProg formulation + data section, translated and solved by GLPK (for quadratic families: a separately
// built model solved by Ipopt). A sample is kept only when both routes reach the expected status and,
// when optimal, objectives agree within a relative 1e-6.
#pragma once
#include <string>
#include <vector>

#include "orkit/gen/instance.h"
#include "orkit/lp/model.h"

namespace trex::orkit::gen {

struct VerifyOptions {
  double rel_tol = 1e-6;
  double time_limit_s = 30.0;  // per solve; hitting it rejects the sample ("time_limit")
};

struct Verdict {
  bool ok = false;
  std::string reason;  // rejection reason class when !ok ("objective_mismatch", "route2_status", ...)
  std::string detail;  // human-readable detail
  std::string lp;      // the LP text of route 1 (the sample's lp field)
  Expected status = Expected::Optimal;
  double objective = 0.0;          // route 1's objective when optimal
  double objective_route2 = 0.0;
  std::vector<double> values;      // route 1's solution (names as in the re-read LP model)
  Model lp_model;                  // the re-read model (variable names as in the LP file)
  std::string solver1, solver2, log1, log2;
  double seconds = 0.0;
};

Verdict verify_instance(const Instance& inst, const VerifyOptions& opts = {});

// Solves a MathProg program (model + data) with GLPK; the route-2 solver.
SolveResult solve_mathprog(const std::string& program, double time_limit_s);

// Re-solves an LP file and checks it against a recorded status/objective (what a consumer of the data set
// can do for any kept sample). Returns an empty string when it agrees, else the reason.
std::string recheck_lp(const std::string& lp_text, const std::string& status, double objective, double rel_tol = 1e-6);

bool objectives_agree(double a, double b, double rel_tol);

}  // namespace trex::orkit::gen
