// Routing families, small on purpose (compact formulations with weak relaxations): the travelling
// salesman problem with Miller-Tucker-Zemlin subtour elimination, and a capacitated vehicle routing
// problem. Route 1 and route 2 use different (equivalent) formulations: TSP MTZ orders in [1, n-1] vs
// [2, n]; CVRP MTZ load variables (route 1) vs a single-commodity flow model (route 2).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

double g(const json& j) {
  return j.get<double>();
}

const std::vector<std::string> kTowns = {"Alder",  "Birch",  "Cedar", "Dogwood", "Elm",   "Fir",
                                         "Ginkgo", "Hazel",  "Ivy",   "Juniper", "Kapok", "Larch",
                                         "Maple",  "Nutmeg", "Olive", "Poplar"};

// Rounded Euclidean distances between random points of a 100 x 100 map (symmetric, integers).
void random_distances(Rng& rng, const std::vector<std::string>& nodes, json& dist) {
  std::vector<std::pair<double, double>> xy;
  for (size_t i = 0; i < nodes.size(); ++i) xy.push_back({rng.real(0, 100, 1), rng.real(0, 100, 1)});
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t j = 0; j < nodes.size(); ++j)
      if (i != j)
        dist[nodes[i]][nodes[j]] =
            std::max(1.0, std::round(std::hypot(xy[i].first - xy[j].first, xy[i].second - xy[j].second)));
}

Table distance_table(const std::vector<std::string>& nodes, const json& dist, const std::string& caption) {
  Table t{caption, {""}, {}};
  for (auto& b : nodes) t.header.push_back(b);
  for (auto& a : nodes) {
    std::vector<std::string> row{a};
    for (auto& b : nodes) row.push_back(a == b ? "-" : num(g(dist[a][b])));
    t.rows.push_back(row);
  }
  return t;
}

std::string distance_prose(const std::vector<std::string>& nodes, const json& dist, const std::string& unit) {
  std::string s;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<std::string> v;
    for (size_t j = i + 1; j < nodes.size(); ++j)
      v.push_back(fmt::format("{} {} to {}", num(g(dist[nodes[i]][nodes[j]])), unit, nodes[j]));
    if (!v.empty()) s += fmt::format("From {} it is {}. ", nodes[i], join_and(v));
  }
  return s + "Distances are the same in both directions.";
}

// ------------------------------------------------------------------------------------------------
Instance tsp(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 4, 5, 6, 7, 8, 9, 10, 11);
  auto V = rng.sample(kTowns, n);
  static const std::vector<std::string> who = {"A sales representative",
                                               "A technician on a maintenance round", "A delivery drone",
                                               "A tour bus", "A mobile library"};
  Instance in;
  in.family = "tsp";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "km";
  json& d = in.data;
  d["cities"] = V;
  for (int i = 0; i < n; ++i) d["rank"][V[i]] = i + 1;
  random_distances(rng, V, d["distance"]);
  in.story =
      fmt::format("{} starts in {}, must visit each of {} exactly once and return to {}.", rng.pick(who),
                  V[0], join_and(std::vector<std::string>(V.begin() + 1, V.end())), V[0]);
  in.inline_data = distance_prose(V, d["distance"], "km");
  in.tables = {distance_table(V, d["distance"], "Road distances (km):")};
  in.question = "What is the shortest round trip? Give its length.";
  in.data_keys = {{"cities", "cities; the tour starts and ends at the first one"},
                  {"rank", "position of each city in the list (1 = start)"},
                  {"distance", "distance[a][b] in km (symmetric)"}};
  // Route 1: MTZ with orders u in [1, n-1] for the cities other than the start.
  ModelBuilder mb("tsp", Sense::Minimize);
  std::map<std::pair<int, int>, int> x;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) mb.obj(x[{i, j}] = mb.binary("x_" + V[i] + "_" + V[j]), g(d["distance"][V[i]][V[j]]));
  std::vector<int> u(n, -1);
  for (int i = 1; i < n; ++i) u[i] = mb.var("u_" + V[i], 1, n - 1);
  for (int i = 0; i < n; ++i) {
    const int ro = mb.row("leave_" + V[i], RowSense::EQ, 1), ri = mb.row("enter_" + V[i], RowSense::EQ, 1);
    for (int j = 0; j < n; ++j)
      if (i != j) mb.add(ro, x[{i, j}], 1), mb.add(ri, x[{j, i}], 1);
  }
  for (int i = 1; i < n; ++i)
    for (int j = 1; j < n; ++j)
      if (i != j) {
        const int r = mb.row("mtz_" + V[i] + "_" + V[j], RowSense::LE, n - 2);
        mb.add(r, u[i], 1);
        mb.add(r, u[j], -1);
        mb.add(r, x[{i, j}], n - 1);
      }
  in.model = mb.take();
  in.mathprog = R"(set cities; param rank{cities}; param distance{cities, cities} default 0;
param n := card(cities);
var x{i in cities, j in cities: i <> j} binary;
var order{i in cities: rank[i] > 1} >= 2, <= n;
minimize length: sum{i in cities, j in cities: i <> j} distance[i,j] * x[i,j];
s.t. out{i in cities}: sum{j in cities: j <> i} x[i,j] = 1;
s.t. inn{j in cities}: sum{i in cities: i <> j} x[i,j] = 1;
s.t. subtour{i in cities, j in cities: i <> j and rank[i] > 1 and rank[j] > 1}:
  order[i] - order[j] + n * x[i,j] <= n - 1;
)";
  in.formulation = R"(Sets:
- V: cities, with start city 0; n = |V|.
Parameters:
- d_(i,j): distance from i to j.
Decision variables:
- x_(i,j) binary: the tour goes directly from i to j (i != j).
- u_i in [1, n-1], continuous: position of city i in the tour (i != 0), for subtour elimination.
Objective:
- minimize sum_(i != j) d_(i,j) * x_(i,j)
Constraints:
- leave each city once: sum_j x_(i,j) = 1; enter each city once: sum_i x_(i,j) = 1
- Miller-Tucker-Zemlin: u_i - u_j + (n - 1) * x_(i,j) <= n - 2 for all i != j, both != 0)";
  in.python_body = R"(V = data["cities"]
n = len(V)
D = data["distance"]
A = [(i, j) for i in V for j in V if i != j]
model = gp.Model("tsp")
x = model.addVars(A, lb=0, ub=1, vtype=GRB.BINARY, name="x")
u = model.addVars(V[1:], lb=1, ub=n - 1, name="u")
model.setObjective(gp.quicksum(D[i][j] * x[i, j] for (i, j) in A), GRB.MINIMIZE)
for i in V:
    model.addConstr(x.sum(i, "*") == 1, name=f"leave_{i}")
    model.addConstr(x.sum("*", i) == 1, name=f"enter_{i}")
for (i, j) in A:
    if i != V[0] and j != V[0]:
        model.addConstr(u[i] - u[j] + (n - 1) * x[i, j] <= n - 2, name=f"mtz_{i}_{j}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format(
          "A symmetric TSP on {} cities written as an asymmetric assignment model plus MTZ constraints.", n),
      {"Binary arc variables x_(i,j), one in and one out per city.",
       "Degree constraints alone allow subtours; MTZ order variables u_i forbid them.",
       fmt::format("{} binaries and {} MTZ rows: small enough for branch and bound.", n * (n - 1),
                   (n - 1) * (n - 2))});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance vrp(Rng& rng, const GenRequest& req) {
  const int nc = size_for(rng, req.difficulty, 3, 4, 4, 5, 5, 5, 5, 6);  // 7 customers: up to ~10 s per solve
  auto names = rng.sample(kTowns, nc + 1);
  const std::string depot = names[0] + "_Depot";
  std::vector<std::string> C(names.begin() + 1, names.end()), V{depot};
  V.insert(V.end(), C.begin(), C.end());
  Instance in;
  in.family = "vrp";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "km";
  json& d = in.data;
  d["nodes"] = V;
  d["customers"] = C;
  double total = 0, biggest = 0;
  for (auto& c : C) {
    total += g(d["demand"][c] = rng.integer(2, 12) * 10);
    biggest = std::max(biggest, g(d["demand"][c]));
  }
  const double cap = std::max(biggest, std::ceil(total / rng.real(1.5, 3.0, 0.1) / 10) * 10);
  d["capacity"] = cap;
  const int need = static_cast<int>(std::ceil(total / cap));  // a lower bound on the vans needed
  // First-fit decreasing packs the orders into vans: that many vans are always enough (the bound alone
  // is not, since orders cannot be split).
  std::vector<double> dems, loads;
  for (auto& c : C) dems.push_back(g(d["demand"][c]));
  std::sort(dems.rbegin(), dems.rend());
  for (double q : dems) {
    auto it = std::find_if(loads.begin(), loads.end(), [&](double l) { return l + q <= cap; });
    if (it == loads.end())
      loads.push_back(q);
    else
      *it += q;
  }
  const int packed = static_cast<int>(loads.size());
  const bool infeasible = req.target == Expected::Infeasible && need >= 2;
  d["vehicles"] = infeasible ? need - 1 : packed + rng.integer(0, 1);
  random_distances(rng, V, d["distance"]);
  if (infeasible) {
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("the customers need {} kg in total but {} vans of {} kg carry at most {}",
                                   num(total), num(g(d["vehicles"])), num(cap), num(g(d["vehicles"]) * cap));
  }
  in.story = fmt::format(
      "A bakery delivers from {} to {} shops ({}). It has {} identical vans of {} kg capacity; each van used "
      "leaves "
      "the depot once, serves some shops and comes back. Every shop is served by exactly one van.",
      depot, nc, join_and(C), num(g(d["vehicles"])), num(cap));
  std::vector<std::string> dem;
  for (auto& c : C) dem.push_back(fmt::format("{} needs {} kg", c, num(g(d["demand"][c]))));
  in.inline_data = capitalize(join_and(dem)) + ". " + distance_prose(V, d["distance"], "km");
  Table t1{"Shop orders:", {"Shop", "Demand (kg)"}, {}};
  for (auto& c : C) t1.rows.push_back({c, num(g(d["demand"][c]))});
  in.tables = {t1, distance_table(V, d["distance"], "Distances (km):")};
  in.table_lead = fmt::format("Vans available: {}, capacity {} kg each.", num(g(d["vehicles"])), num(cap));
  in.question = "Plan the routes that minimise the total distance driven.";
  in.data_keys = {{"nodes", "depot (first) and shops"}, {"customers", "shops"},
                  {"demand", "demand per shop (kg)"},   {"capacity", "van capacity (kg)"},
                  {"vehicles", "number of vans"},       {"distance", "distance[a][b] in km (symmetric)"}};
  // Route 1: two-index model with MTZ load variables.
  ModelBuilder mb("vrp", Sense::Minimize);
  const int n = static_cast<int>(V.size());
  std::map<std::pair<int, int>, int> x;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) mb.obj(x[{i, j}] = mb.binary("x_" + V[i] + "_" + V[j]), g(d["distance"][V[i]][V[j]]));
  std::vector<int> load(n, -1);
  for (int i = 1; i < n; ++i) load[i] = mb.var("load_" + V[i], g(d["demand"][V[i]]), cap);
  for (int i = 1; i < n; ++i) {
    const int ro = mb.row("leave_" + V[i], RowSense::EQ, 1), ri = mb.row("enter_" + V[i], RowSense::EQ, 1);
    for (int j = 0; j < n; ++j)
      if (i != j) mb.add(ro, x[{i, j}], 1), mb.add(ri, x[{j, i}], 1);
  }
  const int rk = mb.row("fleet", RowSense::LE, g(d["vehicles"])),
            rb = mb.row("depot_balance", RowSense::EQ, 0);
  for (int j = 1; j < n; ++j) mb.add(rk, x[{0, j}], 1), mb.add(rb, x[{0, j}], 1), mb.add(rb, x[{j, 0}], -1);
  for (int i = 1; i < n; ++i)
    for (int j = 1; j < n; ++j)
      if (i != j) {  // load_j >= load_i + q_j - Q (1 - x_ij)
        const int r = mb.row("load_" + V[i] + "_" + V[j], RowSense::LE, cap - g(d["demand"][V[j]]));
        mb.add(r, load[i], 1);
        mb.add(r, load[j], -1);
        mb.add(r, x[{i, j}], cap);
      }
  in.model = mb.take();
  // Route 2: single-commodity flow: the goods on board leave the depot and drop q_j at each shop.
  in.mathprog = R"(set nodes; set customers within nodes;
param demand{customers}; param capacity; param vehicles; param distance{nodes, nodes} default 0;
set depots := nodes diff customers;
var x{i in nodes, j in nodes: i <> j} binary;
var carry{i in nodes, j in nodes: i <> j} >= 0;
minimize km: sum{i in nodes, j in nodes: i <> j} distance[i,j] * x[i,j];
s.t. visit_out{c in customers}: sum{j in nodes: j <> c} x[c,j] = 1;
s.t. visit_in{c in customers}: sum{i in nodes: i <> c} x[i,c] = 1;
s.t. fleet: sum{o in depots, j in customers} x[o,j] <= vehicles;
s.t. drop{c in customers}: sum{i in nodes: i <> c} carry[i,c] - sum{j in nodes: j <> c} carry[c,j] = demand[c];
s.t. on_board{i in nodes, j in nodes: i <> j}: carry[i,j] <= capacity * x[i,j];
)";
  in.formulation = R"(Sets:
- V = {0} + C: depot 0 and customers C.
Parameters:
- q_c demand; Q van capacity; K vans; d_(i,j) distance.
Decision variables:
- x_(i,j) binary: a van drives from i to j; l_c in [q_c, Q]: load delivered up to and including c.
Objective:
- minimize sum_(i != j) d_(i,j) * x_(i,j)
Constraints:
- each customer entered and left once: sum_i x_(i,c) = 1, sum_j x_(c,j) = 1
- fleet: sum_j x_(0,j) <= K; vans return: sum_j x_(0,j) = sum_j x_(j,0)
- load propagation (MTZ, also eliminates subtours): l_i - l_j + Q * x_(i,j) <= Q - q_j for customers i != j)";
  in.python_body = R"(V = data["nodes"]
C = data["customers"]
depot = V[0]
Q = data["capacity"]
D = data["distance"]
A = [(i, j) for i in V for j in V if i != j]
model = gp.Model("vrp")
x = model.addVars(A, lb=0, ub=1, vtype=GRB.BINARY, name="x")
l = model.addVars(C, lb={c: data["demand"][c] for c in C}, ub=Q, name="load")
model.setObjective(gp.quicksum(D[i][j] * x[i, j] for (i, j) in A), GRB.MINIMIZE)
for c in C:
    model.addConstr(x.sum(c, "*") == 1, name=f"leave_{c}")
    model.addConstr(x.sum("*", c) == 1, name=f"enter_{c}")
model.addConstr(x.sum(depot, "*") <= data["vehicles"], name="fleet")
model.addConstr(x.sum(depot, "*") == x.sum("*", depot), name="depot_balance")
for (i, j) in A:
    if i != depot and j != depot:
        model.addConstr(l[i] - l[j] + Q * x[i, j] <= Q - data["demand"][j], name=f"load_{i}_{j}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("A capacitated VRP: {} customers, {} vans of capacity {}.", nc, num(g(d["vehicles"])),
                  num(cap)),
      {"Binary arc variables; every customer has in- and out-degree 1.",
       "At most K routes leave the depot, and as many return.",
       "Cumulative load variables l_c in [q_c, Q] with MTZ-type rows enforce capacity and remove subtours.",
       fmt::format("Total demand {} needs at least {} van(s).", num(total), need)});
  return in;
}

}  // namespace

void add_routing_families(std::vector<Family>& out) {
  out.push_back({"tsp", "routing", false, false, &tsp});
  out.push_back({"vrp", "routing", true, false, &vrp});
}

}  // namespace trex::orkit::gen
