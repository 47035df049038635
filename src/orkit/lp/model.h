// An optimisation model as the OR toolkit passes it around: variables with bounds and types, a
// linear (optionally quadratic) objective, linear (optionally quadratic) constraints. This is what the
// LP-file reader/writer, the solver backends, the data generator and the evaluator share.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace trex::orkit {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

enum class VarType { Continuous, Integer, Binary };
enum class Sense { Minimize, Maximize };
enum class RowSense { LE, GE, EQ };

struct Variable {
  std::string name;
  double lb = 0.0;  // CPLEX LP default: [0, +inf)
  double ub = kInf;
  VarType type = VarType::Continuous;
};

struct LinTerm {
  int var;
  double coef;
};
struct QuadTerm {  // coef * x_i * x_j (i may equal j); stored once per unordered pair
  int i, j;
  double coef;
};

struct Constraint {
  std::string name;
  std::vector<LinTerm> lin;
  std::vector<QuadTerm> quad;
  RowSense sense = RowSense::LE;
  double rhs = 0.0;
};

struct Model {
  std::string name;
  Sense sense = Sense::Minimize;
  double objective_constant = 0.0;
  std::vector<LinTerm> objective;
  std::vector<QuadTerm> objective_quad;  // the objective is lin + quad (no 1/2 factor)
  std::vector<Variable> vars;
  std::vector<Constraint> rows;

  bool has_integers() const {
    for (const auto& v : vars)
      if (v.type != VarType::Continuous) return true;
    return false;
  }
  bool is_quadratic() const {
    if (!objective_quad.empty()) return true;
    for (const auto& r : rows)
      if (!r.quad.empty()) return true;
    return false;
  }
};

enum class SolveStatus { Optimal, Infeasible, Unbounded, InfeasibleOrUnbounded, Limit, Error };

struct SolveResult {
  SolveStatus status = SolveStatus::Error;
  double objective = 0.0;          // valid when Optimal (or Limit with a feasible point)
  std::vector<double> values;      // one per variable, when a solution exists
  std::string solver;              // "cbc", "clp", "glpk", "ipopt"
  std::string message;             // solver log summary or error text
  double seconds = 0.0;
};

}  // namespace trex::orkit
