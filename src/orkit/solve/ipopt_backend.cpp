// Ipopt backend (C interface) for continuous models with quadratic objective and/or quadratic rows,
// and a depth-first branch and bound over Ipopt relaxations for mixed-integer quadratic models.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "orkit/lp/model_util.h"
#include "orkit/solve/backends.h"

#ifdef TREX_HAVE_IPOPT
#include <IpStdCInterface.h>
#endif

namespace trex::orkit::detail {

#ifndef TREX_HAVE_IPOPT

SolveResult solve_ipopt(const Model&, const SolveOptions&) {
  SolveResult r;
  r.solver = "ipopt";
  r.message = "Ipopt was not built into this trex";
  return r;
}
SolveResult solve_miqp_bnb(const Model& m, const SolveOptions& o) { return solve_ipopt(m, o); }

#else

namespace {

constexpr double kIpoptInf = 1e20;

// Objective and constraints in the form Ipopt evaluates: f(x) = s * (c'x + sum q x_i x_j), with
// s = -1 for maximisation; g_k(x) = a_k'x + sum q x_i x_j.
struct NlpData {
  const Model* model = nullptr;
  double sign = 1.0;
  std::vector<double> grad_c;  // dense linear objective (signed)
  // Jacobian: per row, slots of its variables.
  std::vector<int> jac_row, jac_col;
  struct RowSlots {
    std::vector<std::pair<int, double>> lin;  // (slot, coef)
    struct Q {
      int i, j, si, sj;
      double q;
    };
    std::vector<Q> quad;
  };
  std::vector<RowSlots> rows;
  // Hessian (lower triangle): objective entries and per-row entries as (slot, value-per-unit).
  std::vector<int> h_row, h_col;
  std::vector<std::pair<int, double>> h_obj;
  std::vector<std::vector<std::pair<int, double>>> h_rows;
};

void build(NlpData& d, const Model& m) {
  d.model = &m;
  d.sign = m.sense == Sense::Maximize ? -1.0 : 1.0;
  const int n = static_cast<int>(m.vars.size());
  d.grad_c.assign(n, 0.0);
  for (const auto& t : m.objective) d.grad_c[t.var] += d.sign * t.coef;
  std::map<std::pair<int, int>, int> hslot;
  auto hess = [&](int i, int j) {
    if (i < j) std::swap(i, j);
    auto [it, fresh] = hslot.emplace(std::make_pair(i, j), static_cast<int>(d.h_row.size()));
    if (fresh) {
      d.h_row.push_back(i);
      d.h_col.push_back(j);
    }
    return it->second;
  };
  // d^2/dx_i dx_j of q x_i x_j is q (i != j); of q x_i^2 it is 2q.
  for (const auto& q : m.objective_quad) d.h_obj.push_back({hess(q.i, q.j), d.sign * q.coef * (q.i == q.j ? 2 : 1)});
  d.rows.resize(m.rows.size());
  d.h_rows.resize(m.rows.size());
  for (size_t k = 0; k < m.rows.size(); ++k) {
    const Constraint& r = m.rows[k];
    std::map<int, int> slot;
    auto jac = [&](int j) {
      auto [it, fresh] = slot.emplace(j, static_cast<int>(d.jac_row.size()));
      if (fresh) {
        d.jac_row.push_back(static_cast<int>(k));
        d.jac_col.push_back(j);
      }
      return it->second;
    };
    for (const auto& t : r.lin) d.rows[k].lin.push_back({jac(t.var), t.coef});
    for (const auto& q : r.quad) {
      d.rows[k].quad.push_back({q.i, q.j, jac(q.i), jac(q.j), q.coef});
      d.h_rows[k].push_back({hess(q.i, q.j), q.coef * (q.i == q.j ? 2 : 1)});
    }
  }
}

Bool eval_f(Index n, Number* x, Bool, Number* obj, UserDataPtr ud) {
  const auto& d = *static_cast<NlpData*>(ud);
  double v = 0.0;
  for (Index j = 0; j < n; ++j) v += d.grad_c[j] * x[j];
  for (const auto& q : d.model->objective_quad) v += d.sign * q.coef * x[q.i] * x[q.j];
  *obj = v;
  return TRUE;
}

Bool eval_grad_f(Index n, Number* x, Bool, Number* grad, UserDataPtr ud) {
  const auto& d = *static_cast<NlpData*>(ud);
  for (Index j = 0; j < n; ++j) grad[j] = d.grad_c[j];
  for (const auto& q : d.model->objective_quad) {
    grad[q.i] += d.sign * q.coef * x[q.j];
    grad[q.j] += d.sign * q.coef * x[q.i];
  }
  return TRUE;
}

Bool eval_g(Index, Number* x, Bool, Index m, Number* g, UserDataPtr ud) {
  const auto& d = *static_cast<NlpData*>(ud);
  for (Index k = 0; k < m; ++k) {
    const Constraint& r = d.model->rows[k];
    double v = 0.0;
    for (const auto& t : r.lin) v += t.coef * x[t.var];
    for (const auto& q : r.quad) v += q.coef * x[q.i] * x[q.j];
    g[k] = v;
  }
  return TRUE;
}

Bool eval_jac_g(Index, Number* x, Bool, Index, Index nele, Index* irow, Index* jcol, Number* values,
                UserDataPtr ud) {
  const auto& d = *static_cast<NlpData*>(ud);
  if (!values) {
    for (Index e = 0; e < nele; ++e) irow[e] = d.jac_row[e], jcol[e] = d.jac_col[e];
    return TRUE;
  }
  std::fill(values, values + nele, 0.0);
  for (const auto& r : d.rows) {
    for (const auto& [s, a] : r.lin) values[s] += a;
    for (const auto& q : r.quad) {
      values[q.si] += q.q * x[q.j];
      values[q.sj] += q.q * x[q.i];
    }
  }
  return TRUE;
}

Bool eval_h(Index, Number*, Bool, Number obj_factor, Index m, Number* lambda, Bool, Index nele, Index* irow,
            Index* jcol, Number* values, UserDataPtr ud) {
  const auto& d = *static_cast<NlpData*>(ud);
  if (!values) {
    for (Index e = 0; e < nele; ++e) irow[e] = d.h_row[e], jcol[e] = d.h_col[e];
    return TRUE;
  }
  std::fill(values, values + nele, 0.0);
  for (const auto& [s, v] : d.h_obj) values[s] += obj_factor * v;
  for (Index k = 0; k < m; ++k)
    for (const auto& [s, v] : d.h_rows[k]) values[s] += lambda[k] * v;
  return TRUE;
}

struct IpoptRun {
  ApplicationReturnStatus status = Internal_Error;
  std::vector<double> x;
};

// Solves the continuous relaxation with the given variable bounds.
IpoptRun run_ipopt(const Model& m, const std::vector<double>& lb, const std::vector<double>& ub,
                   const SolveOptions& o, double time_left_s) {
  NlpData d;
  build(d, m);
  const Index n = static_cast<Index>(m.vars.size()), mr = static_cast<Index>(m.rows.size());
  auto clip = [](double v) { return std::max(-kIpoptInf, std::min(kIpoptInf, v)); };
  std::vector<Number> xl(n), xu(n), gl(mr), gu(mr), x(n);
  for (Index j = 0; j < n; ++j) {
    xl[j] = clip(lb[j]);
    xu[j] = clip(ub[j]);
    // Start inside the box, away from a bound where possible (interior point method).
    if (std::isfinite(lb[j]) && std::isfinite(ub[j])) x[j] = 0.5 * (lb[j] + ub[j]);
    else if (std::isfinite(lb[j])) x[j] = lb[j] + 1.0;
    else if (std::isfinite(ub[j])) x[j] = ub[j] - 1.0;
    else x[j] = 0.0;
  }
  for (Index k = 0; k < mr; ++k) {
    const Constraint& r = m.rows[k];
    gl[k] = r.sense == RowSense::LE ? -kIpoptInf : clip(r.rhs);
    gu[k] = r.sense == RowSense::GE ? kIpoptInf : clip(r.rhs);
  }
  IpoptProblem p = CreateIpoptProblem(n, xl.data(), xu.data(), mr, gl.data(), gu.data(),
                                      static_cast<Index>(d.jac_row.size()), static_cast<Index>(d.h_row.size()),
                                      0, &eval_f, &eval_g, &eval_grad_f, &eval_jac_g, &eval_h);
  IpoptRun out;
  if (!p) return out;
  AddIpoptIntOption(p, const_cast<char*>("print_level"), o.verbose ? 5 : 0);
  AddIpoptStrOption(p, const_cast<char*>("sb"), const_cast<char*>("yes"));
  AddIpoptNumOption(p, const_cast<char*>("tol"), 1e-10);
  AddIpoptNumOption(p, const_cast<char*>("acceptable_tol"), 1e-8);
  AddIpoptIntOption(p, const_cast<char*>("max_iter"), 5000);
  AddIpoptStrOption(p, const_cast<char*>("mu_strategy"), const_cast<char*>("adaptive"));
  if (time_left_s > 0) AddIpoptNumOption(p, const_cast<char*>("max_cpu_time"), time_left_s);
  std::vector<Number> g(mr);
  Number obj = 0.0;
  {
    StdoutSilencer silence(!o.verbose);
    out.status = IpoptSolve(p, x.data(), mr ? g.data() : nullptr, &obj, nullptr, nullptr, nullptr, &d);
  }
  FreeIpoptProblem(p);
  out.x.assign(x.begin(), x.end());
  return out;
}

bool converged(ApplicationReturnStatus s) { return s == Solve_Succeeded || s == Solved_To_Acceptable_Level; }

}  // namespace

SolveResult solve_ipopt(const Model& model, const SolveOptions& o) {
  SolveResult res;
  res.solver = "ipopt";
  std::vector<double> lb, ub;
  for (const auto& v : model.vars) lb.push_back(v.lb), ub.push_back(v.ub);
  IpoptRun run = run_ipopt(model, lb, ub, o, o.time_limit_s);
  if (converged(run.status)) {
    res.status = SolveStatus::Optimal;
    res.values = std::move(run.x);
    if (model.is_quadratic()) res.message = "ipopt: local optimum (global when the model is convex)";
  } else if (run.status == Infeasible_Problem_Detected) {
    res.status = SolveStatus::Infeasible;
    res.message = "ipopt: converged to a point of local infeasibility";
  } else if (run.status == Diverging_Iterates) {
    res.status = SolveStatus::Unbounded;
    res.message = "ipopt: iterates diverged (objective unbounded)";
  } else if (run.status == Maximum_CpuTime_Exceeded || run.status == Maximum_Iterations_Exceeded) {
    res.status = SolveStatus::Limit;
    res.message = "ipopt: time/iteration limit";
  } else {
    res.message = "ipopt: return status " + std::to_string(static_cast<int>(run.status));
  }
  return res;
}

// Depth-first branch and bound on the most fractional integer variable; nodes are pruned by the
// relaxation bound (valid for convex models).
SolveResult solve_miqp_bnb(const Model& model, const SolveOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SolveResult res;
  res.solver = "ipopt";
  const size_t n = model.vars.size();
  const double s = model.sense == Sense::Maximize ? -1.0 : 1.0;  // minimise s * objective
  struct Node {
    std::vector<double> lb, ub;
  };
  Node root;
  for (const auto& v : model.vars) {
    double lb = v.lb, ub = v.ub;
    if (v.type == VarType::Binary) lb = std::max(lb, 0.0), ub = std::min(ub, 1.0);
    if (v.type != VarType::Continuous) lb = std::ceil(lb - 1e-9), ub = std::floor(ub + 1e-9);
    root.lb.push_back(lb);
    root.ub.push_back(ub);
  }
  std::vector<Node> stack{root};
  double incumbent = kInf;
  std::vector<double> best;
  int nodes = 0;
  bool unbounded = false, incomplete = false;
  while (!stack.empty()) {
    if (nodes >= o.miqp_node_limit) {
      incomplete = true;
      break;
    }
    double left = 0.0;
    if (o.time_limit_s > 0) {
      left = o.time_limit_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) {
        incomplete = true;
        break;
      }
    }
    Node node = std::move(stack.back());
    stack.pop_back();
    ++nodes;
    IpoptRun run = run_ipopt(model, node.lb, node.ub, o, left);
    if (run.status == Diverging_Iterates) {
      unbounded = true;
      break;
    }
    if (!converged(run.status)) {
      if (run.status != Infeasible_Problem_Detected) incomplete = true;
      continue;
    }
    const double value = s * objective_value(model, run.x);
    if (value >= incumbent - 1e-9 * std::max(1.0, std::abs(incumbent))) continue;
    int branch = -1;
    double worst = 1e-6;
    for (size_t j = 0; j < n; ++j) {
      if (model.vars[j].type == VarType::Continuous) continue;
      const double frac = std::abs(run.x[j] - std::round(run.x[j]));
      if (frac > worst) worst = frac, branch = static_cast<int>(j);
    }
    if (branch < 0) {
      incumbent = value;
      best = run.x;
      for (size_t j = 0; j < n; ++j)
        if (model.vars[j].type != VarType::Continuous) best[j] = std::round(best[j]);
      continue;
    }
    Node down = node, up = std::move(node);
    down.ub[branch] = std::floor(run.x[branch]);
    up.lb[branch] = std::ceil(run.x[branch]);
    // Explore the side the relaxation leans to first.
    if (run.x[branch] - std::floor(run.x[branch]) >= 0.5) {
      stack.push_back(std::move(down));
      stack.push_back(std::move(up));
    } else {
      stack.push_back(std::move(up));
      stack.push_back(std::move(down));
    }
  }
  const std::string tally = " (" + std::to_string(nodes) + " nodes)";
  if (unbounded) {
    res.status = SolveStatus::Unbounded;
    res.message = "ipopt branch and bound: relaxation diverged (unbounded)" + tally;
  } else if (!best.empty()) {
    res.status = incomplete ? SolveStatus::Limit : SolveStatus::Optimal;
    res.values = std::move(best);
    res.message = std::string(incomplete ? "ipopt branch and bound: node/time limit, best found"
                                         : "ipopt branch and bound: optimal for convex relaxations") + tally;
  } else {
    res.status = incomplete ? SolveStatus::Limit : SolveStatus::Infeasible;
    res.message = std::string(incomplete ? "ipopt branch and bound: limit without a feasible point"
                                         : "ipopt branch and bound: no integer feasible point") + tally;
  }
  return res;
}

#endif

}  // namespace trex::orkit::detail
