// Exact global solution of models whose only non-linearity is complementarity rows x_i * x_j = 0
// (or q x_i x_j <= 0 with q > 0) over nonnegative variables, as LLM-written "either-or" models produce
// (e.g. the ORGEval crop-rotation rows). Dropping those rows gives a valid linear relaxation; a
// violated pair is branched on as x_i = 0 or x_j = 0. Each node is solved by a linear backend, so
// integers are handled too.
#include <chrono>
#include <cmath>

#include "orkit/lp/model_util.h"
#include "orkit/solve/backends.h"

namespace trex::orkit::detail {

bool is_complementarity_model(const Model& m) {
  if (!m.objective_quad.empty()) return false;
  bool any = false;
  for (const auto& r : m.rows) {
    if (r.quad.empty()) continue;
    if (!r.lin.empty() || r.quad.size() != 1 || r.rhs != 0.0) return false;
    const QuadTerm& q = r.quad[0];
    if (q.i == q.j || q.coef == 0.0) return false;
    const bool ok = r.sense == RowSense::EQ || (r.sense == RowSense::LE && q.coef > 0) ||
                    (r.sense == RowSense::GE && q.coef < 0);
    if (!ok || m.vars[q.i].lb < 0 || m.vars[q.j].lb < 0) return false;
    any = true;
  }
  return any;
}

SolveResult solve_complementarity(const Model& model, const SolveOptions& o, SolverKind linear) {
  const auto t0 = std::chrono::steady_clock::now();
  Model base = model;
  std::vector<std::pair<int, int>> pairs;
  base.rows.clear();
  for (const auto& r : model.rows) {
    if (r.quad.empty()) base.rows.push_back(r);
    else pairs.push_back({r.quad[0].i, r.quad[0].j});
  }
  const double s = model.sense == Sense::Maximize ? -1.0 : 1.0;
  std::vector<std::vector<int>> stack{{}};  // variables fixed to 0 at each node
  double incumbent = kInf;
  std::vector<double> best;
  int nodes = 0;
  bool incomplete = false, unbounded_relaxation = false;
  SolveOptions lo = o;
  lo.solver = linear;
  SolveResult res;
  while (!stack.empty()) {
    double left = 0.0;
    if (o.time_limit_s > 0) {
      left = o.time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) {
        incomplete = true;
        break;
      }
    }
    if (nodes >= o.miqp_node_limit) {
      incomplete = true;
      break;
    }
    std::vector<int> fixed = std::move(stack.back());
    stack.pop_back();
    ++nodes;
    Model node = base;
    for (int j : fixed) node.vars[j].ub = 0.0;
    lo.time_limit_s = o.time_limit_s > 0 ? left : 0.0;
    const SolveResult r = solve(node, lo);
    res.solver = r.solver;
    if (r.status == SolveStatus::Infeasible) continue;
    if (r.status == SolveStatus::Unbounded || r.status == SolveStatus::InfeasibleOrUnbounded) {
      unbounded_relaxation = true;
      break;
    }
    if (r.status != SolveStatus::Optimal) {
      incomplete = true;
      continue;
    }
    const double value = s * r.objective;
    if (value >= incumbent - 1e-9 * std::max(1.0, std::abs(incumbent))) continue;
    int branch = -1;
    double worst = 0.0;
    for (size_t k = 0; k < pairs.size(); ++k) {
      const double a = std::abs(r.values[pairs[k].first]), b = std::abs(r.values[pairs[k].second]);
      const double viol = std::min(a, b);  // distance from the nearest branch
      if (viol > 1e-9 * std::max(1.0, std::max(a, b)) && viol > worst) worst = viol, branch = static_cast<int>(k);
    }
    if (branch < 0) {
      incumbent = value;
      best = r.values;
      continue;
    }
    std::vector<int> left_child = fixed, right_child = std::move(fixed);
    left_child.push_back(pairs[branch].first);
    right_child.push_back(pairs[branch].second);
    stack.push_back(std::move(left_child));
    stack.push_back(std::move(right_child));
  }
  const std::string tally = " (complementarity branch and bound, " + std::to_string(nodes) + " nodes)";
  if (unbounded_relaxation) {
    res.status = SolveStatus::InfeasibleOrUnbounded;
    res.message = "a linear relaxation is unbounded" + tally;
  } else if (!best.empty()) {
    res.status = incomplete ? SolveStatus::Limit : SolveStatus::Optimal;
    res.values = std::move(best);
    res.message = std::string(incomplete ? "limit reached, best point found" : "global optimum") + tally;
  } else {
    res.status = incomplete ? SolveStatus::Limit : SolveStatus::Infeasible;
    res.message = std::string(incomplete ? "limit reached without a feasible point" : "infeasible") + tally;
  }
  return res;
}

}  // namespace trex::orkit::detail
