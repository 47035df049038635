#include "orkit/lp/model_util.h"

#include <cmath>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace trex::orkit {

int find_var(const Model& model, std::string_view name) {
  for (size_t i = 0; i < model.vars.size(); ++i)
    if (model.vars[i].name == name) return static_cast<int>(i);
  return -1;
}

int find_row(const Model& model, std::string_view name) {
  for (size_t i = 0; i < model.rows.size(); ++i)
    if (model.rows[i].name == name) return static_cast<int>(i);
  return -1;
}

double objective_value(const Model& model, const std::vector<double>& x) {
  TREX_CHECK(x.size() == model.vars.size(), "objective_value: {} values for {} variables", x.size(),
             model.vars.size());
  double v = model.objective_constant;
  for (const auto& t : model.objective) v += t.coef * x[t.var];
  for (const auto& q : model.objective_quad) v += q.coef * x[q.i] * x[q.j];
  return v;
}

double row_activity(const Constraint& row, const std::vector<double>& x) {
  double a = 0.0;
  for (const auto& t : row.lin) a += t.coef * x[t.var];
  for (const auto& q : row.quad) a += q.coef * x[q.i] * x[q.j];
  return a;
}

Violation max_violation(const Model& model, const std::vector<double>& x) {
  TREX_CHECK(x.size() == model.vars.size(), "max_violation: {} values for {} variables", x.size(),
             model.vars.size());
  Violation out;
  auto note = [&](double amount, const std::string& where) {
    if (amount > out.max_abs) {
      out.max_abs = amount;
      out.where = where;
    }
  };
  for (size_t j = 0; j < model.vars.size(); ++j) {
    const Variable& v = model.vars[j];
    if (!std::isfinite(x[j])) {
      note(kInf, "value " + v.name);
      continue;
    }
    note(v.lb - x[j], "bound " + v.name);
    note(x[j] - v.ub, "bound " + v.name);
    if (v.type != VarType::Continuous) note(std::abs(x[j] - std::round(x[j])), "integrality " + v.name);
  }
  for (const auto& r : model.rows) {
    const double a = row_activity(r, x);
    if (r.sense != RowSense::GE) note(a - r.rhs, "row " + r.name);
    if (r.sense != RowSense::LE) note(r.rhs - a, "row " + r.name);
  }
  return out;
}

void merge_duplicate_terms(std::vector<LinTerm>& lin) {
  std::unordered_map<int, size_t> at;
  std::vector<LinTerm> out;
  out.reserve(lin.size());
  for (const auto& t : lin) {
    auto [it, fresh] = at.emplace(t.var, out.size());
    if (fresh)
      out.push_back(t);
    else
      out[it->second].coef += t.coef;
  }
  lin = std::move(out);
}

void merge_duplicate_terms(std::vector<QuadTerm>& quad) {
  std::unordered_map<long long, size_t> at;
  std::vector<QuadTerm> out;
  out.reserve(quad.size());
  for (auto t : quad) {
    if (t.i > t.j) std::swap(t.i, t.j);
    const long long key = (static_cast<long long>(t.i) << 32) | static_cast<unsigned>(t.j);
    auto [it, fresh] = at.emplace(key, out.size());
    if (fresh)
      out.push_back(t);
    else
      out[it->second].coef += t.coef;
  }
  quad = std::move(out);
}

const char* status_name(SolveStatus status) {
  switch (status) {
    case SolveStatus::Optimal: return "optimal";
    case SolveStatus::Infeasible: return "infeasible";
    case SolveStatus::Unbounded: return "unbounded";
    case SolveStatus::InfeasibleOrUnbounded: return "infeasible_or_unbounded";
    case SolveStatus::Limit: return "limit";
    case SolveStatus::Error: return "error";
  }
  return "error";
}

SolveStatus parse_status(std::string_view name) {
  for (auto s : {SolveStatus::Optimal, SolveStatus::Infeasible, SolveStatus::Unbounded,
                 SolveStatus::InfeasibleOrUnbounded, SolveStatus::Limit, SolveStatus::Error})
    if (name == status_name(s)) return s;
  fail("unknown solve status '{}' (expected optimal, infeasible, unbounded, infeasible_or_unbounded, limit, error)",
       name);
}

}  // namespace trex::orkit
