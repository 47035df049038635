// Route 1 of the verification: a thin helper the family generators use to write trex::orkit::Model
// directly from their data (variables, rows and coefficients in C++, independent of the MathProg text).
#pragma once
#include <map>
#include <string>

#include "core/error.h"
#include "orkit/gen/text.h"
#include "orkit/lp/model.h"

namespace trex::orkit::gen {

class ModelBuilder {
 public:
  ModelBuilder(std::string name, Sense sense) {
    m_.name = std::move(name);
    m_.sense = sense;
  }
  int var(const std::string& name, double lb = 0.0, double ub = kInf, VarType type = VarType::Continuous) {
    const std::string id = ident(name);
    TREX_ASSERT(index_.count(id) == 0);
    index_[id] = static_cast<int>(m_.vars.size());
    m_.vars.push_back({id, lb, ub, type});
    return static_cast<int>(m_.vars.size()) - 1;
  }
  int integer(const std::string& name, double lb = 0.0, double ub = kInf) {
    return var(name, lb, ub, VarType::Integer);
  }
  int binary(const std::string& name) { return var(name, 0.0, 1.0, VarType::Binary); }
  void obj(int v, double c) {
    if (c != 0.0) m_.objective.push_back({v, c});
  }
  void obj_quad(int i, int j, double c) {
    if (c != 0.0) m_.objective_quad.push_back({std::min(i, j), std::max(i, j), c});
  }
  int row(const std::string& name, RowSense sense, double rhs) {
    m_.rows.push_back({ident(name), {}, {}, sense, rhs});
    return static_cast<int>(m_.rows.size()) - 1;
  }
  void add(int r, int v, double c) {
    if (c != 0.0) m_.rows[r].lin.push_back({v, c});
  }
  Model take() { return std::move(m_); }

 private:
  Model m_;
  std::map<std::string, int> index_;
};

}  // namespace trex::orkit::gen
