#include "orkit/gen/verify.h"

#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "orkit/gen/mathprog_data.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/mathprog.h"
#include "orkit/solve/solve.h"

namespace trex::orkit::gen {
namespace {

bool status_matches(SolveStatus s, Expected e) {
  switch (e) {
    case Expected::Optimal: return s == SolveStatus::Optimal;
    case Expected::Infeasible: return s == SolveStatus::Infeasible;
    case Expected::Unbounded: return s == SolveStatus::Unbounded;
  }
  return false;
}

}  // namespace

bool objectives_agree(double a, double b, double rel_tol) {
  return std::fabs(a - b) <= rel_tol * std::max({1.0, std::fabs(a), std::fabs(b)});
}

Verdict verify_instance(const Instance& inst, const VerifyOptions& opts) {
  Verdict v;
  v.status = inst.expected;
  const auto t0 = std::chrono::steady_clock::now();
  auto reject = [&](std::string reason, std::string detail) {
    v.ok = false;
    v.reason = std::move(reason);
    v.detail = std::move(detail);
    v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return v;
  };
  // Route 1: LP text round trip, then CBC (or Ipopt for a quadratic model).
  try {
    LpWriteOptions wo;
    wo.portable_names = true;
    v.lp = write_lp(inst.model, wo);
    v.lp_model = read_lp(v.lp, inst.family + ".lp");
  } catch (const trex::Error& e) {
    return reject("lp_roundtrip", e.what());
  }
  SolveOptions so;
  so.time_limit_s = opts.time_limit_s;
  so.mip_gap = 0.0;
  so.solver = v.lp_model.is_quadratic() ? SolverKind::Ipopt : SolverKind::Cbc;
  SolveResult r1 = solve(v.lp_model, so);
  v.solver1 = r1.solver;
  v.log1 = r1.message;
  if (r1.status == SolveStatus::Limit) return reject("time_limit", "route 1 hit the time limit");
  if (!status_matches(r1.status, inst.expected))
    return reject("route1_status", fmt::format("route 1 ({}) returned {}, expected {}: {}", r1.solver,
                                               status_name(r1.status), expected_name(inst.expected), r1.message));
  // Route 2: the family's own formulation.
  SolveResult r2;
  if (inst.route2_model) {
    SolveOptions s2 = so;
    s2.solver = SolverKind::Ipopt;
    r2 = solve(*inst.route2_model, s2);
  } else {
    try {
      r2 = solve_mathprog(mathprog_program(inst), opts.time_limit_s);
    } catch (const trex::Error& e) {
      return reject("mathprog_error", e.what());
    }
  }
  v.solver2 = r2.solver;
  v.log2 = r2.message;
  if (r2.status == SolveStatus::Limit) return reject("time_limit", "route 2 hit the time limit");
  if (!status_matches(r2.status, inst.expected))
    return reject("route2_status", fmt::format("route 2 ({}) returned {}, expected {}: {}", r2.solver,
                                               status_name(r2.status), expected_name(inst.expected), r2.message));
  if (inst.expected == Expected::Optimal) {
    v.objective = r1.objective;
    v.objective_route2 = r2.objective;
    if (!objectives_agree(r1.objective, r2.objective, opts.rel_tol))
      return reject("objective_mismatch", fmt::format("route 1 ({}) {:.12g} vs route 2 ({}) {:.12g}", r1.solver,
                                                      r1.objective, r2.solver, r2.objective));
    // The route-1 point must also satisfy the model as the builder wrote it (catches a lossy LP round trip).
    const Violation viol = max_violation(v.lp_model, r1.values);
    if (viol.max_abs > 1e-5)
      return reject("infeasible_point", fmt::format("route 1 solution violates {} by {:.3g}", viol.where, viol.max_abs));
    v.values = r1.values;
  }
  v.ok = true;
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return v;
}

SolveResult solve_mathprog(const std::string& program, double time_limit_s) {
  SolveOptions so;
  so.solver = SolverKind::Glpk;
  so.time_limit_s = time_limit_s;
  so.mip_gap = 0.0;
  return orkit::solve_mathprog(program, {}, so, "<ordata mathprog>").result;
}

std::string recheck_lp(const std::string& lp_text, const std::string& status, double objective, double rel_tol) {
  const Model m = read_lp(lp_text, "<sample lp>");
  SolveOptions so;
  so.mip_gap = 0.0;
  so.time_limit_s = 60;
  const SolveResult r = solve(m, so);
  if (status_name(r.status) != status) return fmt::format("status {} but recorded {}", status_name(r.status), status);
  if (r.status == SolveStatus::Optimal && !objectives_agree(r.objective, objective, rel_tol))
    return fmt::format("objective {:.12g} but recorded {:.12g}", r.objective, objective);
  return "";
}

}  // namespace trex::orkit::gen
