// Network families: transportation, transshipment, assignment, shortest path, maximum flow, min-cost flow.
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

const std::vector<std::string> kCities = {
    "Austin", "Boston", "Chicago", "Denver", "Detroit", "Houston", "Memphis", "Miami", "Omaha", "Phoenix",
    "Portland", "Raleigh", "Reno", "Seattle", "Tampa", "Tulsa", "Albany", "Atlanta", "Dallas", "Fresno",
    "Boise", "Dayton", "ElPaso", "Lincoln", "Madison", "Mobile", "Ogden", "Salem", "Toledo", "Wichita",
    "Akron", "Aurora", "Berlin", "Lyon", "Porto", "Milan", "Oslo", "Riga", "Turin", "Ghent", "Leeds", "Bremen",
    "Graz", "Basel", "Cork", "Malmo", "Split", "Nantes", "Bergen", "Tartu", "Kaunas", "Brno", "Lodz", "Varna"};

struct Goods {
  std::string noun, unit, source, sink;
};
const std::vector<Goods> kGoods = {{"cement", "tons", "plant", "construction site"},
                                   {"grain", "tons", "silo", "mill"},
                                   {"bottled water", "pallets", "bottling plant", "distribution centre"},
                                   {"steel coils", "tons", "mill", "fabrication shop"},
                                   {"vaccines", "boxes", "warehouse", "clinic"},
                                   {"timber", "truckloads", "sawmill", "retail yard"}};

// ------------------------------------------------------------------------------------------------
Instance transportation(Rng& rng, const GenRequest& req) {
  const int ns = size_for(rng, req.difficulty, 2, 3, 3, 5, 6, 10, 12, 20);
  const int nd = size_for(rng, req.difficulty, 2, 4, 4, 6, 8, 14, 15, 30);
  const Goods& g = rng.pick(kGoods);
  auto names = rng.sample(kCities, ns + nd);
  std::vector<std::string> S(names.begin(), names.begin() + ns), D(names.begin() + ns, names.end());
  const bool integer = rng.chance(0.3);
  Instance in;
  in.family = "transportation";
  in.problem_class = integer ? "MILP" : "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["sources"] = S;
  d["destinations"] = D;
  double total_demand = 0;
  for (auto& j : D) {
    d["demand"][j] = rng.integer(20, 200);
    total_demand += d["demand"][j].get<double>();
  }
  const bool infeasible = req.target == Expected::Infeasible;
  const double slack = infeasible ? rng.real(0.75, 0.92, 0.01) : rng.real(1.05, 1.4, 0.01);
  double total_supply = 0;
  for (int i = 0; i < ns; ++i) {
    double v = std::round(total_demand * slack / ns * rng.real(0.8, 1.2, 0.01));
    d["supply"][S[i]] = v;
    total_supply += v;
  }
  if (!infeasible && total_supply < total_demand) {
    d["supply"][S[0]] = d["supply"][S[0]].get<double>() + (total_demand - total_supply);
    total_supply = total_demand;
  }
  if (infeasible && total_supply >= total_demand) {  // rounding can't fix it: force the shortage
    d["supply"][S[0]] = std::max(0.0, d["supply"][S[0]].get<double>() - (total_supply - total_demand) - 5);
    total_supply = 0;
    for (auto& i : S) total_supply += d["supply"][i].get<double>();
  }
  for (auto& i : S)
    for (auto& j : D) d["cost"][i][j] = rng.real(1, 25, 0.5);
  if (infeasible) {
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("total demand is {} {} but the sources can ship only {} {}", num(total_demand),
                                   g.unit, num(total_supply), g.unit);
  }
  in.story = fmt::format(
      "A distributor ships {} from {} {}s ({}) to {} {}s ({}). Each {} has a limited supply, every {} must "
      "receive its full demand, and shipping costs depend on the route.",
      g.noun, ns, g.source, join_and(S), nd, g.sink, join_and(D), g.source, g.sink);
  std::string inl;
  for (auto& i : S) inl += fmt::format("{} can supply {} {}. ", i, num(d["supply"][i].get<double>()), g.unit);
  for (auto& j : D) inl += fmt::format("{} needs {} {}. ", j, num(d["demand"][j].get<double>()), g.unit);
  for (auto& i : S) {
    std::vector<std::string> c;
    for (auto& j : D) c.push_back(fmt::format("{} to {}", money(d["cost"][i][j].get<double>()), j));
    inl += fmt::format("Shipping one unit from {} costs {}. ", i, join_and(c));
  }
  in.inline_data = inl;
  Table t{"Unit shipping cost ($) and supply/demand (" + g.unit + "):", {"From \\ To"}, {}};
  for (auto& j : D) t.header.push_back(j);
  t.header.push_back("Supply");
  for (auto& i : S) {
    std::vector<std::string> row{i};
    for (auto& j : D) row.push_back(num(d["cost"][i][j].get<double>()));
    row.push_back(num(d["supply"][i].get<double>()));
    t.rows.push_back(row);
  }
  std::vector<std::string> drow{"Demand"};
  for (auto& j : D) drow.push_back(num(d["demand"][j].get<double>()));
  drow.push_back("");
  t.rows.push_back(drow);
  in.tables = {t};
  in.question = integer ? "Shipments must be whole units. Find the shipping plan of minimum total cost."
                        : "Find the shipping plan of minimum total cost.";
  in.data_keys = {{"sources", "list of source names"}, {"destinations", "list of destination names"},
                  {"supply", "supply of each source"}, {"demand", "demand of each destination"},
                  {"cost", "cost[source][destination]: cost per unit shipped"}};
  ModelBuilder mb("transportation", Sense::Minimize);
  std::map<std::pair<std::string, std::string>, int> x;
  for (auto& i : S)
    for (auto& j : D) {
      x[{i, j}] = mb.var("x_" + i + "_" + j, 0, kInf, integer ? VarType::Integer : VarType::Continuous);
      mb.obj(x[{i, j}], d["cost"][i][j].get<double>());
    }
  for (auto& i : S) {
    int r = mb.row("supply_" + i, RowSense::LE, d["supply"][i].get<double>());
    for (auto& j : D) mb.add(r, x[{i, j}], 1);
  }
  for (auto& j : D) {
    int r = mb.row("demand_" + j, RowSense::GE, d["demand"][j].get<double>());
    for (auto& i : S) mb.add(r, x[{i, j}], 1);
  }
  in.model = mb.take();
  in.mathprog = std::string(R"(set sources; set destinations;
param supply{sources}; param demand{destinations};
param cost{sources, destinations};
var x{sources, destinations} >= 0)") + (integer ? ", integer" : "") + R"(;
minimize total_cost: sum{i in sources, j in destinations} cost[i,j] * x[i,j];
s.t. sup{i in sources}: sum{j in destinations} x[i,j] <= supply[i];
s.t. dem{j in destinations}: sum{i in sources} x[i,j] >= demand[j];
)";
  in.formulation = fmt::format(R"(Sets:
- I: sources; J: destinations.
Parameters:
- s_i: supply of source i; d_j: demand of destination j; c_(i,j): cost per unit shipped from i to j.
Decision variables:
- x_(i,j) >= 0: units shipped from i to j ({}).
Objective:
- minimize sum_(i in I) sum_(j in J) c_(i,j) * x_(i,j)
Constraints:
- supply: sum_(j in J) x_(i,j) <= s_i for every i in I
- demand: sum_(i in I) x_(i,j) >= d_j for every j in J)",
                               integer ? "integer" : "continuous");
  in.python_body = fmt::format(R"(I = data["sources"]
J = data["destinations"]
model = gp.Model("transportation")
x = model.addVars(I, J, lb=0, ub=GRB.INFINITY, vtype={}, name="x")
model.setObjective(gp.quicksum(data["cost"][i][j] * x[i, j] for i in I for j in J), GRB.MINIMIZE)
for i in I:
    model.addConstr(x.sum(i, "*") <= data["supply"][i], name=f"supply_{{i}}")
for j in J:
    model.addConstr(x.sum("*", j) >= data["demand"][j], name=f"demand_{{j}}")
model.optimize()
)",
                               integer ? "GRB.INTEGER" : "GRB.CONTINUOUS");
  in.reasoning = bullet_reasoning(
      fmt::format("A classic transportation problem with {} sources and {} destinations.", ns, nd),
      {fmt::format("Variables: x_(i,j), the amount shipped on each of the {} routes, {}.", ns * nd,
                   integer ? "integer because shipments are whole units" : "continuous"),
       "Objective: minimise total shipping cost.",
       "Supply rows: what leaves a source is at most its supply.",
       "Demand rows: what reaches a destination is at least its demand.",
       fmt::format("Total supply {} vs total demand {}.", num(total_supply), num(total_demand))});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance assignment(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 3, 4, 5, 7, 8, 12, 14, 25);
  const int m = n + (rng.chance(0.4) ? rng.integer(1, 3) : 0);  // tasks >= workers? workers >= tasks
  struct Theme {
    std::string who, what, verb, measure;
  };
  static const std::vector<Theme> themes = {{"technician", "repair job", "handles", "hours"},
                                            {"translator", "document", "translates", "hours"},
                                            {"crane", "ship berth", "serves", "minutes"},
                                            {"nurse", "ward", "covers", "cost units"},
                                            {"contractor", "project", "builds", "thousand dollars"}};
  const Theme& th = rng.pick(themes);
  static const std::vector<std::string> people = {"Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivan",
                                                  "Jo", "Kai", "Lea", "Max", "Nia", "Omar", "Pia", "Quin", "Rosa",
                                                  "Sam", "Tara", "Uma", "Vic", "Wes", "Xena", "Yuri", "Zoe", "Abe",
                                                  "Bea", "Cy", "Dora"};
  auto W = rng.sample(people, m);
  std::vector<std::string> T;
  for (int k = 0; k < n; ++k) T.push_back(fmt::format("{}{}", capitalize(th.what.substr(0, th.what.find(' '))), k + 1));
  Instance in;
  in.family = "assignment";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = th.measure;
  json& d = in.data;
  d["workers"] = W;
  d["tasks"] = T;
  for (auto& w : W)
    for (auto& t : T) d["cost"][w][t] = rng.integer(3, 60);
  in.story = fmt::format(
      "A manager assigns {} {}s to {} {}s. Each {} {} at most one {} and every {} must be covered by exactly one "
      "{}. The effort (in {}) depends on who does what.",
      m, th.who, n, th.what, th.who, th.verb, th.what, th.what, th.who, th.measure);
  std::string inl;
  for (auto& w : W) {
    std::vector<std::string> c;
    for (auto& t : T) c.push_back(fmt::format("{} for {}", num(d["cost"][w][t].get<double>()), t));
    inl += fmt::format("{} needs {}. ", w, join_and(c));
  }
  in.inline_data = inl;
  Table t{"Effort (" + th.measure + ") of each " + th.who + " on each " + th.what + ":", {capitalize(th.who)}, {}};
  for (auto& k : T) t.header.push_back(k);
  for (auto& w : W) {
    std::vector<std::string> row{w};
    for (auto& k : T) row.push_back(num(d["cost"][w][k].get<double>()));
    t.rows.push_back(row);
  }
  in.tables = {t};
  in.question = "Which assignment minimises the total effort?";
  in.data_keys = {{"workers", "list of worker names"}, {"tasks", "list of task names"},
                  {"cost", "cost[worker][task]: effort if the worker does the task"}};
  ModelBuilder mb("assignment", Sense::Minimize);
  std::map<std::pair<std::string, std::string>, int> x;
  for (auto& w : W)
    for (auto& k : T) {
      x[{w, k}] = mb.binary("x_" + w + "_" + k);
      mb.obj(x[{w, k}], d["cost"][w][k].get<double>());
    }
  for (auto& w : W) {
    int r = mb.row("worker_" + w, RowSense::LE, 1);
    for (auto& k : T) mb.add(r, x[{w, k}], 1);
  }
  for (auto& k : T) {
    int r = mb.row("task_" + k, RowSense::EQ, 1);
    for (auto& w : W) mb.add(r, x[{w, k}], 1);
  }
  in.model = mb.take();
  in.mathprog = R"(set workers; set tasks;
param cost{workers, tasks};
var x{workers, tasks} binary;
minimize effort: sum{w in workers, t in tasks} cost[w,t] * x[w,t];
s.t. one_task{w in workers}: sum{t in tasks} x[w,t] <= 1;
s.t. covered{t in tasks}: sum{w in workers} x[w,t] = 1;
)";
  in.formulation = R"(Sets:
- W: workers; T: tasks.
Parameters:
- c_(w,t): effort when worker w does task t.
Decision variables:
- x_(w,t) binary: 1 if worker w is assigned to task t.
Objective:
- minimize sum_(w,t) c_(w,t) * x_(w,t)
Constraints:
- each worker at most one task: sum_(t in T) x_(w,t) <= 1 for every w
- each task exactly one worker: sum_(w in W) x_(w,t) = 1 for every t)";
  in.python_body = R"(W = data["workers"]
T = data["tasks"]
model = gp.Model("assignment")
x = model.addVars(W, T, lb=0, ub=1, vtype=GRB.BINARY, name="x")
model.setObjective(gp.quicksum(data["cost"][w][t] * x[w, t] for w in W for t in T), GRB.MINIMIZE)
for w in W:
    model.addConstr(x.sum(w, "*") <= 1, name=f"worker_{w}")
for t in T:
    model.addConstr(x.sum("*", t) == 1, name=f"task_{t}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("An assignment problem: {} workers, {} tasks, minimise total effort.", m, n),
      {"Binary x_(w,t) says whether worker w does task t.",
       "Every task is covered exactly once (equality); a worker takes at most one task (<= 1, since "
       "there may be more workers than tasks).",
       "The constraint matrix is totally unimodular, but declaring the variables binary is still correct."});
  return in;
}

// ------------------------------------------------------------------------------------------------
// A random connected directed graph over `n` nodes: a path 0->1->...->n-1 plus random extra arcs.
std::vector<std::pair<int, int>> random_digraph(Rng& rng, int n, double density) {
  std::vector<std::pair<int, int>> arcs;
  std::vector<std::vector<bool>> has(n, std::vector<bool>(n, false));
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  for (int i = 0; i + 1 < n; ++i) {
    arcs.push_back({order[i], order[i + 1]});
    has[order[i]][order[i + 1]] = true;
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j && !has[i][j] && !has[j][i] && rng.chance(density)) {
        arcs.push_back({i, j});
        has[i][j] = true;
      }
  return arcs;
}

Instance shortest_path(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 5, 6, 7, 10, 12, 20, 25, 40);
  auto nodes = rng.sample(kCities, n);
  auto arcs = random_digraph(rng, n, std::min(0.4, 3.0 / n));
  const bool minutes = rng.chance(0.5);
  Instance in;
  in.family = "shortest_path";
  in.problem_class = "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = minutes ? "minutes" : "km";
  json& d = in.data;
  d["nodes"] = nodes;
  json arcl = json::array();
  for (auto [a, b] : arcs) {
    arcl.push_back({nodes[a], nodes[b]});
    d["length"][nodes[a]][nodes[b]] = rng.integer(3, 90);
  }
  d["arcs"] = arcl;
  // supply: +1 at origin, -1 at destination (flow balance right-hand side)
  for (int i = 0; i < n; ++i) d["net_supply"][nodes[i]] = i == 0 ? 1 : (i == n - 1 ? -1 : 0);
  const std::string o = nodes[0], t = nodes[n - 1];
  in.story = fmt::format(
      "A courier must travel from {} to {} over a one-way road network. Each road segment has a travel {}.",
      o, t, minutes ? "time" : "distance");
  std::string inl;
  for (auto [a, b] : arcs)
    inl += fmt::format("The road from {} to {} takes {} {}. ", nodes[a], nodes[b],
                       num(d["length"][nodes[a]][nodes[b]].get<double>()), in.objective_unit);
  in.inline_data = inl + "Roads can only be used in the stated direction.";
  Table tb{"One-way road segments:", {"From", "To", minutes ? "Time (min)" : "Distance (km)"}, {}};
  for (auto [a, b] : arcs) tb.rows.push_back({nodes[a], nodes[b], num(d["length"][nodes[a]][nodes[b]].get<double>())});
  in.tables = {tb};
  in.question = fmt::format("What is the shortest route from {} to {}? Model it as a network flow of one unit.", o, t);
  in.data_keys = {{"nodes", "list of node names"}, {"arcs", "list of [from, to] pairs"},
                  {"length", "length[from][to] of each arc"},
                  {"net_supply", "+1 at the origin, -1 at the destination, 0 elsewhere"}};
  ModelBuilder mb("shortest_path", Sense::Minimize);
  std::vector<int> x;
  for (auto [a, b] : arcs) {
    x.push_back(mb.var("x_" + nodes[a] + "_" + nodes[b], 0, kInf));
    mb.obj(x.back(), d["length"][nodes[a]][nodes[b]].get<double>());
  }
  for (int i = 0; i < n; ++i) {
    int r = mb.row("balance_" + nodes[i], RowSense::EQ, i == 0 ? 1 : (i == n - 1 ? -1 : 0));
    for (size_t k = 0; k < arcs.size(); ++k) {
      if (arcs[k].first == i) mb.add(r, x[k], 1);
      if (arcs[k].second == i) mb.add(r, x[k], -1);
    }
  }
  in.model = mb.take();
  in.mathprog = R"(set nodes; set arcs within nodes cross nodes;
param length{arcs}; param net_supply{nodes};
var x{arcs} >= 0;
minimize total_length: sum{(i,j) in arcs} length[i,j] * x[i,j];
s.t. balance{v in nodes}: sum{(a,j) in arcs: a = v} x[a,j] - sum{(i,b) in arcs: b = v} x[i,b] = net_supply[v];
)";
  in.formulation = R"(Sets:
- N: nodes; A: directed arcs (i, j).
Parameters:
- l_(i,j): length of arc (i, j); b_v: +1 at the origin, -1 at the destination, 0 otherwise.
Decision variables:
- x_(i,j) >= 0: flow on arc (i, j) (1 if the arc is on the path; the LP has integral optimal vertices).
Objective:
- minimize sum_((i,j) in A) l_(i,j) * x_(i,j)
Constraints:
- flow balance: sum_(j:(v,j) in A) x_(v,j) - sum_(i:(i,v) in A) x_(i,v) = b_v for every v in N)";
  in.python_body = R"(N = data["nodes"]
A = [tuple(a) for a in data["arcs"]]
model = gp.Model("shortest_path")
x = model.addVars(A, lb=0, ub=GRB.INFINITY, name="x")
model.setObjective(gp.quicksum(data["length"][i][j] * x[i, j] for (i, j) in A), GRB.MINIMIZE)
for v in N:
    model.addConstr(gp.quicksum(x[i, j] for (i, j) in A if i == v)
                    - gp.quicksum(x[i, j] for (i, j) in A if j == v) == data["net_supply"][v], name=f"balance_{v}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Shortest path from {} to {} on {} nodes and {} arcs, written as a min-cost flow of one unit.", o, t,
                  n, arcs.size()),
      {"Variables x_(i,j) >= 0 on the arcs; the flow-balance matrix is totally unimodular, so the LP optimum is a "
       "0/1 path.",
       "Objective: total length of the arcs used.", "One balance equation per node: +1 at the origin, -1 at the "
       "destination."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance max_flow(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 5, 6, 7, 10, 12, 20, 25, 40);
  auto nodes = rng.sample(kCities, n);
  auto arcs = random_digraph(rng, n, std::min(0.45, 3.5 / n));
  Instance in;
  in.family = "max_flow";
  in.problem_class = "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "units per hour";
  const std::string s = nodes[0], t = nodes[n - 1];
  json& d = in.data;
  d["nodes"] = nodes;
  json arcl = json::array();
  for (auto [a, b] : arcs) {
    arcl.push_back({nodes[a], nodes[b]});
    d["capacity"][nodes[a]][nodes[b]] = rng.integer(5, 80);
  }
  d["arcs"] = arcl;
  for (int i = 0; i < n; ++i) d["is_source"][nodes[i]] = i == 0 ? 1 : 0;
  for (int i = 0; i < n; ++i) d["is_sink"][nodes[i]] = i == n - 1 ? 1 : 0;
  const bool unbounded = req.target == Expected::Unbounded;
  d["uncapacitated"] = json::array();
  if (unbounded) {  // a direct link without a capacity limit
    d["uncapacitated"] = json::array({json::array({s, t})});
    in.expected = Expected::Unbounded;
    in.status_reason = fmt::format("the direct pipe from {} to {} has no capacity limit", s, t);
  }
  static const std::vector<std::string> media = {"pipeline network carrying oil", "data network carrying traffic",
                                                 "canal system carrying barges", "road network carrying trucks"};
  in.story = fmt::format("A {} connects {} (the source) with {} (the sink) through intermediate nodes. Each link "
                         "has a capacity in units per hour and can be used only in its direction.",
                         rng.pick(media), s, t);
  std::string inl;
  for (auto [a, b] : arcs)
    inl += fmt::format("{} -> {} carries up to {}. ", nodes[a], nodes[b], num(d["capacity"][nodes[a]][nodes[b]].get<double>()));
  if (unbounded) inl += fmt::format("There is also a direct link {} -> {} with no capacity limit. ", s, t);
  in.inline_data = inl;
  Table tb{"Links and capacities (units per hour):", {"From", "To", "Capacity"}, {}};
  for (auto [a, b] : arcs) tb.rows.push_back({nodes[a], nodes[b], num(d["capacity"][nodes[a]][nodes[b]].get<double>())});
  in.tables = {tb};
  if (unbounded) in.table_lead = fmt::format("In addition, a direct link {} -> {} has no capacity limit.", s, t);
  in.question = fmt::format("What is the maximum flow per hour that can be sent from {} to {}?", s, t);
  in.data_keys = {{"nodes", "list of node names"}, {"arcs", "list of [from, to] links with a capacity"},
                  {"capacity", "capacity[from][to]"}, {"is_source", "1 for the source node"},
                  {"is_sink", "1 for the sink node"},
                  {"uncapacitated", "list of [from, to] links without a capacity limit (may be empty)"}};
  ModelBuilder mb("max_flow", Sense::Maximize);
  std::vector<std::pair<int, int>> all = arcs;
  std::vector<int> x;
  for (auto [a, b] : arcs) x.push_back(mb.var("f_" + nodes[a] + "_" + nodes[b], 0, d["capacity"][nodes[a]][nodes[b]].get<double>()));
  if (unbounded) {
    all.push_back({0, n - 1});
    x.push_back(mb.var("u_" + s + "_" + t, 0, kInf));
  }
  for (size_t k = 0; k < all.size(); ++k) {
    if (all[k].first == 0) mb.obj(x[k], 1);
    if (all[k].second == 0) mb.obj(x[k], -1);
  }
  for (int i = 1; i + 1 < n; ++i) {
    int r = mb.row("conserve_" + nodes[i], RowSense::EQ, 0);
    for (size_t k = 0; k < all.size(); ++k) {
      if (all[k].first == i) mb.add(r, x[k], 1);
      if (all[k].second == i) mb.add(r, x[k], -1);
    }
  }
  in.model = mb.take();
  in.mathprog = R"(set nodes; set arcs within nodes cross nodes;
set uncapacitated within nodes cross nodes;
param capacity{arcs}; param is_source{nodes}; param is_sink{nodes};
var f{arcs} >= 0;
var u{uncapacitated} >= 0;
s.t. cap{(i,j) in arcs}: f[i,j] <= capacity[i,j];
maximize outflow: sum{(i,j) in arcs: is_source[i] = 1} f[i,j] - sum{(i,j) in arcs: is_source[j] = 1} f[i,j]
  + sum{(i,j) in uncapacitated: is_source[i] = 1} u[i,j] - sum{(i,j) in uncapacitated: is_source[j] = 1} u[i,j];
s.t. conserve{v in nodes: is_source[v] = 0 and is_sink[v] = 0}:
  sum{(a,j) in arcs: a = v} f[a,j] + sum{(a,j) in uncapacitated: a = v} u[a,j]
  = sum{(i,b) in arcs: b = v} f[i,b] + sum{(i,b) in uncapacitated: b = v} u[i,b];
)";
  in.formulation = R"(Sets:
- N: nodes with source s and sink t; A: directed links.
Parameters:
- u_(i,j): capacity of link (i, j) (links listed as uncapacitated have none).
Decision variables:
- f_(i,j): flow on link (i, j), 0 <= f_(i,j) <= u_(i,j), continuous.
Objective:
- maximize the net flow out of s: sum_(j) f_(s,j) - sum_(i) f_(i,s)
Constraints:
- conservation: inflow = outflow at every node other than s and t)";
  in.python_body = R"(N = data["nodes"]
A = [tuple(a) for a in data["arcs"]]
U = [tuple(a) for a in data.get("uncapacitated", [])]
src = [v for v in N if data["is_source"][v] == 1][0]
snk = [v for v in N if data["is_sink"][v] == 1][0]
model = gp.Model("max_flow")
f = model.addVars(A, lb=0, ub={a: data["capacity"][a[0]][a[1]] for a in A}, name="f")
u = model.addVars(U, lb=0, ub=GRB.INFINITY, name="u")
def flow(i, j):
    return (f[i, j] if (i, j) in f else 0) + (u[i, j] if (i, j) in u else 0)
arcs = A + U
model.setObjective(gp.quicksum(flow(i, j) for (i, j) in set(arcs) if i == src)
                   - gp.quicksum(flow(i, j) for (i, j) in set(arcs) if j == src), GRB.MAXIMIZE)
for v in N:
    if v in (src, snk):
        continue
    model.addConstr(gp.quicksum(flow(i, j) for (i, j) in set(arcs) if i == v)
                    == gp.quicksum(flow(i, j) for (i, j) in set(arcs) if j == v), name=f"conserve_{v}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Maximum flow from {} to {} on {} nodes and {} links.", s, t, n, arcs.size()),
      {"Flow variables on every link, bounded by the link capacity.", "Maximise the net flow leaving the source.",
       "Flow conservation at every intermediate node."});
  return in;
}

}  // namespace

void add_network_families(std::vector<Family>& out) {
  out.push_back({"transportation", "transportation", true, false, &transportation});
  out.push_back({"assignment", "assignment", false, false, &assignment});
  out.push_back({"shortest_path", "network_flow", false, false, &shortest_path});
  out.push_back({"max_flow", "network_flow", false, true, &max_flow});
}

}  // namespace trex::orkit::gen
