#include "orkit/gen/cpt.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "orkit/gen/text.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/solve.h"

namespace trex::orkit::gen {
namespace {

std::vector<int> binding_rows(const Model& m, const std::vector<double>& x) {
  std::vector<int> out;
  for (size_t r = 0; r < m.rows.size(); ++r) {
    const auto& row = m.rows[r];
    if (row.sense == RowSense::EQ) continue;
    if (std::fabs(row_activity(row, x) - row.rhs) <= 1e-7 * std::max(1.0, std::fabs(row.rhs))) out.push_back(r);
  }
  return out;
}

}  // namespace

std::optional<Sensitivity> measure_sensitivity(const Verdict& v, Rng& rng) {
  if (v.status != Expected::Optimal || v.lp_model.has_integers() || v.lp_model.is_quadratic()) return std::nullopt;
  const auto rows = binding_rows(v.lp_model, v.values);
  if (rows.empty()) return std::nullopt;
  const int r = rows[rng.integer(0, static_cast<int>(rows.size()) - 1)];
  Model m = v.lp_model;
  Sensitivity s;
  s.row = m.rows[r].name;
  s.delta = std::max(1.0, std::round(std::fabs(m.rows[r].rhs) * 0.01));
  m.rows[r].rhs += s.delta;
  SolveOptions so;
  so.solver = SolverKind::Clp;
  so.time_limit_s = 30;
  const SolveResult res = solve(m, so);
  if (res.status != SolveStatus::Optimal) return std::nullopt;
  s.new_objective = res.objective;
  return s;
}

std::string worked_example(const Instance& inst, const Verdict& v, Representation rep,
                           const std::optional<Sensitivity>& sens, Rng& rng) {
  const Model& m = v.lp_model;
  size_t ints = 0, nnz = m.objective.size();
  for (const auto& x : m.vars) ints += x.type != VarType::Continuous;
  for (const auto& r : m.rows) nnz += r.lin.size();
  std::string title = inst.family;
  std::replace(title.begin(), title.end(), '_', ' ');
  std::string doc = fmt::format("# Worked example: {} ({}, {})\n\n", capitalize(title), inst.problem_class,
                                difficulty_name(inst.difficulty));
  doc += "## Problem\n\n" + problem_statement(inst, rep) + "\n\n";
  doc += "## Analysis\n\n" + inst.reasoning + "\n\n";
  doc += "## Formulation\n\n" + inst.formulation + "\n\n";
  doc += "## Gurobi Python code\n\n```python\n" + python_program(inst, rep) + "```\n\n";
  doc += "## Solving the model\n\n";
  doc += fmt::format(
      "The model has {} variables ({} integer or binary), {} constraints and {} nonzero coefficients. ",
      m.vars.size(), ints, m.rows.size(), nnz);
  if (inst.expected == Expected::Optimal) {
    doc += fmt::format(
        "{} reports status optimal with objective value {}{}. An independent formulation solved by {} gives "
        "the same value, so the result is confirmed.\n\n",
        v.solver1, num(std::round(v.objective * 1e6) / 1e6),
        inst.objective_unit.empty() ? "" : " " + inst.objective_unit, v.solver2);
    std::vector<std::pair<double, std::string>> nz;
    for (size_t i = 0; i < m.vars.size(); ++i)
      if (std::fabs(v.values[i]) > 1e-7) nz.push_back({v.values[i], m.vars[i].name});
    if (!nz.empty()) {
      doc += "Nonzero decisions in the optimal solution";
      if (nz.size() > 15) doc += fmt::format(" (first 15 of {})", nz.size());
      doc += ":\n\n";
      for (size_t i = 0; i < std::min<size_t>(15, nz.size()); ++i)
        doc += fmt::format("- {} = {}\n", nz[i].second, num(std::round(nz[i].first * 1e4) / 1e4));
      doc += "\n";
    }
    const auto br = binding_rows(m, v.values);
    if (!br.empty()) {
      std::vector<std::string> names;
      for (size_t i = 0; i < std::min<size_t>(8, br.size()); ++i) names.push_back(m.rows[br[i]].name);
      doc += fmt::format("{} inequality constraints are binding (tight) at the optimum, for example {}.\n\n",
                         br.size(), join_and(names));
    }
    if (sens) {
      const double change = sens->new_objective - v.objective;
      doc += "## Sensitivity\n\n";
      doc += fmt::format(
          "Raising the right-hand side of `{}` by {} and re-solving changes the objective from {} to {}, "
          "i.e. by {} per unit: this is the shadow price (dual value) of that constraint over the range where "
          "the optimal basis does not change.\n",
          sens->row, num(sens->delta), num(std::round(v.objective * 1e4) / 1e4),
          num(std::round(sens->new_objective * 1e4) / 1e4), num(std::round(change / sens->delta * 1e4) / 1e4));
    } else if (m.has_integers()) {
      doc += "## Remarks\n\nBecause the model has integer variables, LP dual values do not apply directly; "
             "the effect of a data change has to be measured by re-solving the integer program.\n";
    }
  } else if (inst.expected == Expected::Infeasible) {
    doc += fmt::format("Both {} and {} report the model infeasible.\n\n## Why it is infeasible\n\n{}.\n",
                       v.solver1, v.solver2, capitalize(inst.status_reason));
    doc += rng.chance(0.5) ? "\nTo restore feasibility one would relax the conflicting requirement (for example "
                             "add a penalised slack variable to it) or add capacity.\n"
                           : "\nA practical remedy is to make the violated requirement soft with a slack variable "
                             "whose cost is high, so that the solver reports how much of it cannot be met.\n";
  } else {
    doc += fmt::format("Both {} and {} report the model unbounded.\n\n## Why it is unbounded\n\n{}.\n",
                       v.solver1, v.solver2, capitalize(inst.status_reason));
    doc += "\nIn practice this signals a missing limit (a market size, a capacity or a budget) in the model.\n";
  }
  return doc;
}

}  // namespace trex::orkit::gen
