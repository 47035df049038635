// The problem families the generator knows, each a function that draws one instance.
#pragma once
#include <string>
#include <vector>

#include "orkit/gen/instance.h"
#include "orkit/gen/rng.h"

namespace trex::orkit::gen {

struct GenRequest {
  Difficulty difficulty = Difficulty::Small;
  Expected target = Expected::Optimal;  // honoured only when the family supports it
  bool short_text = false;              // demo profile: terse stories
};

using GenerateFn = Instance (*)(Rng&, const GenRequest&);

struct Family {
  std::string name;
  std::string structure;  // bucket of the report's taxonomy (transportation, scheduling, ...)
  bool can_infeasible = false;
  bool can_unbounded = false;
  GenerateFn generate = nullptr;
};

const std::vector<Family>& families();
const Family& find_family(const std::string& name);  // throws trex::Error naming the known families

// Families are grouped in files; each group appends its own.
void add_allocation_families(std::vector<Family>& out);
void add_network_families(std::vector<Family>& out);
void add_combinatorial_families(std::vector<Family>& out);
void add_scheduling_families(std::vector<Family>& out);
void add_mixing_families(std::vector<Family>& out);      // diet, blending
void add_planning_families(std::vector<Family>& out);    // crop planning, media allocation, capacity planning
void add_portfolio_families(std::vector<Family>& out);   // mean-variance QP
void add_flow_families(std::vector<Family>& out);        // transshipment, min-cost flow, multi-commodity flow
void add_routing_families(std::vector<Family>& out);     // TSP, CVRP
void add_machine_families(std::vector<Family>& out);     // parallel-machine makespan, staff assignment
void add_cutting_families(std::vector<Family>& out);     // pattern-based cutting stock

// Helpers shared by the family files.
int size_for(Rng& rng, Difficulty d, int s_lo, int s_hi, int m_lo, int m_hi, int l_lo, int l_hi, int i_lo,
             int i_hi);
std::string bullet_reasoning(const std::string& understanding, const std::vector<std::string>& points);

}  // namespace trex::orkit::gen
