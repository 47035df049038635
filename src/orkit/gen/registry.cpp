#include "orkit/gen/registry.h"

#include <fmt/format.h>

#include "core/error.h"

namespace trex::orkit::gen {

const char* difficulty_name(Difficulty d) {
  switch (d) {
    case Difficulty::Small: return "small";
    case Difficulty::Medium: return "medium";
    case Difficulty::Large: return "large";
    case Difficulty::Industrial: return "industrial";
  }
  return "?";
}
const char* expected_name(Expected e) {
  switch (e) {
    case Expected::Optimal: return "optimal";
    case Expected::Infeasible: return "infeasible";
    case Expected::Unbounded: return "unbounded";
  }
  return "?";
}
Difficulty parse_difficulty(const std::string& s) {
  for (Difficulty d : {Difficulty::Small, Difficulty::Medium, Difficulty::Large, Difficulty::Industrial})
    if (s == difficulty_name(d)) return d;
  trex::fail("unknown difficulty '{}' (expected small, medium, large or industrial)", s);
}

const std::vector<Family>& families() {
  static const std::vector<Family> all = [] {
    std::vector<Family> v;
    add_allocation_families(v);
    add_network_families(v);
    add_combinatorial_families(v);
    add_scheduling_families(v);
    add_mixing_families(v);
    add_planning_families(v);
    add_portfolio_families(v);
    add_flow_families(v);
    add_routing_families(v);
    add_machine_families(v);
    add_cutting_families(v);
    return v;
  }();
  return all;
}

const Family& find_family(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& f : families()) {
    if (f.name == name) return f;
    names.push_back(f.name);
  }
  trex::fail("unknown problem family '{}'; known: {}", name, fmt::join(names, ", "));
}

int size_for(Rng& rng, Difficulty d, int s_lo, int s_hi, int m_lo, int m_hi, int l_lo, int l_hi, int i_lo,
             int i_hi) {
  switch (d) {
    case Difficulty::Small: return rng.integer(s_lo, s_hi);
    case Difficulty::Medium: return rng.integer(m_lo, m_hi);
    case Difficulty::Large: return rng.integer(l_lo, l_hi);
    case Difficulty::Industrial: return rng.integer(i_lo, i_hi);
  }
  return s_lo;
}

std::string bullet_reasoning(const std::string& understanding, const std::vector<std::string>& points) {
  std::string out = understanding;
  for (const auto& p : points) out += "\n- " + p;
  return out;
}

}  // namespace trex::orkit::gen
