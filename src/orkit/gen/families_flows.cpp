// Flow families beyond the classic transportation problem: two-stage transshipment through hubs,
// single-commodity min-cost flow with arc capacities, and multi-commodity flow sharing arc capacities.
// Graph instances carry a "backbone" path (node order) with ample capacity so that feasible instances are
// feasible by construction; random extra arcs are cheaper and capacitated, so they shape the optimum.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

double g(const json& j) {
  return j.get<double>();
}

const std::vector<std::string> kPlaces = {
    "Avon",   "Bexley", "Carlow", "Dover",  "Exeter", "Fulton",  "Galway", "Hudson", "Irvine", "Jasper",
    "Kendal", "Leland", "Marion", "Newark", "Oxford", "Preston", "Quincy", "Ripley", "Sutton", "Trenton",
    "Upton",  "Vernon", "Warren", "Yates",  "Zurich", "Ashby",   "Bolton", "Camden", "Durham", "Elgin"};

// Backbone arcs i -> i+1 plus random forward/backward extras without antiparallel duplicates.
std::vector<std::pair<int, int>> graph_with_backbone(Rng& rng, int n, double density) {
  std::vector<std::pair<int, int>> arcs;
  std::set<std::pair<int, int>> has;
  for (int i = 0; i + 1 < n; ++i) {
    arcs.push_back({i, i + 1});
    has.insert({i, i + 1});
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j && !has.count({i, j}) && !has.count({j, i}) && rng.chance(density)) {
        arcs.push_back({i, j});
        has.insert({i, j});
      }
  return arcs;
}

// ------------------------------------------------------------------------------------------------
Instance transshipment(Rng& rng, const GenRequest& req) {
  const int np = size_for(rng, req.difficulty, 2, 2, 2, 3, 3, 5, 5, 8);
  const int nw = size_for(rng, req.difficulty, 2, 2, 2, 3, 3, 5, 4, 7);
  const int nc = size_for(rng, req.difficulty, 2, 3, 3, 5, 6, 10, 10, 16);
  auto names = rng.sample(kPlaces, np + nw + nc);
  std::vector<std::string> P(names.begin(), names.begin() + np),
      W(names.begin() + np, names.begin() + np + nw), C(names.begin() + np + nw, names.end());
  for (auto& p : P) p += "_Plant";
  for (auto& w : W) w += "_Hub";
  const bool integer = rng.chance(0.3);
  Instance in;
  in.family = "transshipment";
  in.problem_class = integer ? "MILP" : "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["plants"] = P;
  d["hubs"] = W;
  d["customers"] = C;
  double dem = 0;
  for (auto& c : C) dem += g(d["demand"][c] = rng.integer(10, 120));
  const bool infeasible = req.target == Expected::Infeasible;
  const bool hub_short = infeasible && rng.chance(0.5);
  double sup = 0, thr = 0;
  for (auto& p : P)
    sup += g(d["supply"][p] =
                 std::ceil(dem * (infeasible && !hub_short ? 0.85 : rng.real(1.1, 1.5, 0.01)) / np));
  for (auto& w : W)
    thr += g(d["throughput"][w] = std::ceil(dem * (hub_short ? 0.85 : rng.real(0.5, 1.0, 0.01) * 1.4) / nw));
  if (!infeasible) {
    if (thr < dem) d["throughput"][W[0]] = g(d["throughput"][W[0]]) + dem - thr, thr = dem;
  } else {
    // Keep the shortage the story states: total supply (or hub throughput) below total demand.
    if (!hub_short && sup >= dem) d["supply"][P[0]] = g(d["supply"][P[0]]) - (sup - dem) - 1, sup = dem - 1;
    if (hub_short && thr >= dem)
      d["throughput"][W[0]] = g(d["throughput"][W[0]]) - (thr - dem) - 1, thr = dem - 1;
    in.expected = Expected::Infeasible;
    in.status_reason =
        hub_short
            ? fmt::format("customers need {} units but the hubs can handle only {}", num(dem), num(thr))
            : fmt::format("customers need {} units but the plants can supply only {}", num(dem), num(sup));
  }
  for (auto& p : P)
    for (auto& w : W) d["inbound_cost"][p][w] = rng.real(1, 12, 0.5);
  for (auto& w : W)
    for (auto& c : C) d["outbound_cost"][w][c] = rng.real(2, 20, 0.5);
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "A manufacturer ships goods from {np} plants ({P}) through {nw} cross-docking hubs ({W}) to "
          "{nc} customers ({C}). Nothing goes directly from a plant to a customer; each hub can "
          "handle a limited volume.",
          "A two-echelon distribution network: plants {P} send product to hubs {W}, which forward it "
          "to customers {C}. Hubs hold no stock, so what enters a hub must leave it."})),
      fmt::arg("np", np), fmt::arg("nw", nw), fmt::arg("nc", nc), fmt::arg("P", join_and(P)),
      fmt::arg("W", join_and(W)), fmt::arg("C", join_and(C)));
  std::string inl;
  for (auto& p : P) inl += fmt::format("{} can supply {} units. ", p, num(g(d["supply"][p])));
  for (auto& w : W) inl += fmt::format("{} can handle {} units. ", w, num(g(d["throughput"][w])));
  for (auto& c : C) inl += fmt::format("{} orders {} units. ", c, num(g(d["demand"][c])));
  for (auto& p : P) {
    std::vector<std::string> v;
    for (auto& w : W) v.push_back(fmt::format("{} to {}", money(g(d["inbound_cost"][p][w])), w));
    inl += fmt::format("Shipping a unit from {} costs {}. ", p, join_and(v));
  }
  for (auto& w : W) {
    std::vector<std::string> v;
    for (auto& c : C) v.push_back(fmt::format("{} to {}", money(g(d["outbound_cost"][w][c])), c));
    inl += fmt::format("From {} a unit costs {}. ", w, join_and(v));
  }
  in.inline_data = inl;
  Table t1{"Plant to hub cost ($/unit) and plant supply:", {"Plant \\ Hub"}, {}};
  for (auto& w : W) t1.header.push_back(w);
  t1.header.push_back("Supply");
  for (auto& p : P) {
    std::vector<std::string> row{p};
    for (auto& w : W) row.push_back(num(g(d["inbound_cost"][p][w])));
    row.push_back(num(g(d["supply"][p])));
    t1.rows.push_back(row);
  }
  Table t2{"Hub to customer cost ($/unit) and hub throughput:", {"Hub \\ Customer"}, {}};
  for (auto& c : C) t2.header.push_back(c);
  t2.header.push_back("Throughput");
  for (auto& w : W) {
    std::vector<std::string> row{w};
    for (auto& c : C) row.push_back(num(g(d["outbound_cost"][w][c])));
    row.push_back(num(g(d["throughput"][w])));
    t2.rows.push_back(row);
  }
  std::vector<std::string> drow{"Demand"};
  for (auto& c : C) drow.push_back(num(g(d["demand"][c])));
  drow.push_back("");
  t2.rows.push_back(drow);
  in.tables = {t1, t2};
  in.question = integer ? "Shipments are in whole units. Find the minimum-cost shipping plan."
                        : "Find the minimum-cost shipping plan.";
  in.data_keys = {{"plants", "plants"},
                  {"hubs", "hubs"},
                  {"customers", "customers"},
                  {"supply", "supply per plant"},
                  {"throughput", "handling capacity per hub"},
                  {"demand", "demand per customer"},
                  {"inbound_cost", "inbound_cost[plant][hub] per unit"},
                  {"outbound_cost", "outbound_cost[hub][customer] per unit"}};
  const VarType vt = integer ? VarType::Integer : VarType::Continuous;
  ModelBuilder mb("transshipment", Sense::Minimize);
  std::map<std::pair<std::string, std::string>, int> a, b;
  for (auto& p : P)
    for (auto& w : W)
      mb.obj(a[{p, w}] = mb.var("in_" + p + "_" + w, 0, kInf, vt), g(d["inbound_cost"][p][w]));
  for (auto& w : W)
    for (auto& c : C)
      mb.obj(b[{w, c}] = mb.var("out_" + w + "_" + c, 0, kInf, vt), g(d["outbound_cost"][w][c]));
  for (auto& p : P) {
    const int r = mb.row("supply_" + p, RowSense::LE, g(d["supply"][p]));
    for (auto& w : W) mb.add(r, a[{p, w}], 1);
  }
  for (auto& w : W) {
    const int r = mb.row("balance_" + w, RowSense::EQ, 0),
              t = mb.row("throughput_" + w, RowSense::LE, g(d["throughput"][w]));
    for (auto& p : P) mb.add(r, a[{p, w}], 1), mb.add(t, a[{p, w}], 1);
    for (auto& c : C) mb.add(r, b[{w, c}], -1);
  }
  for (auto& c : C) {
    const int r = mb.row("demand_" + c, RowSense::GE, g(d["demand"][c]));
    for (auto& w : W) mb.add(r, b[{w, c}], 1);
  }
  in.model = mb.take();
  in.mathprog = std::string(R"(set plants; set hubs; set customers;
param supply{plants}; param throughput{hubs}; param demand{customers};
param inbound_cost{plants, hubs}; param outbound_cost{hubs, customers};
var inb{plants, hubs} >= 0)") +
                (integer ? ", integer" : "") + R"(;
var outb{hubs, customers} >= 0)" +
                (integer ? ", integer" : "") + R"(;
minimize cost: sum{p in plants, w in hubs} inbound_cost[p,w] * inb[p,w]
  + sum{w in hubs, c in customers} outbound_cost[w,c] * outb[w,c];
s.t. sup{p in plants}: sum{w in hubs} inb[p,w] <= supply[p];
s.t. flow{w in hubs}: sum{p in plants} inb[p,w] = sum{c in customers} outb[w,c];
s.t. handle{w in hubs}: sum{c in customers} outb[w,c] <= throughput[w];
s.t. dem{c in customers}: sum{w in hubs} outb[w,c] >= demand[c];
)";
  in.formulation = fmt::format(R"(Sets:
- P: plants; H: hubs; C: customers.
Parameters:
- s_p supply; t_h hub throughput; d_c demand; a_(p,h) inbound cost; b_(h,c) outbound cost.
Decision variables:
- x_(p,h) >= 0, y_(h,c) >= 0: units shipped on each leg ({}).
Objective:
- minimize sum a_(p,h) x_(p,h) + sum b_(h,c) y_(h,c)
Constraints:
- supply: sum_h x_(p,h) <= s_p
- hub balance: sum_p x_(p,h) = sum_c y_(h,c); throughput: sum_p x_(p,h) <= t_h
- demand: sum_h y_(h,c) >= d_c)",
                               integer ? "integer" : "continuous");
  in.python_body = fmt::format(R"(P = data["plants"]
H = data["hubs"]
C = data["customers"]
model = gp.Model("transshipment")
x = model.addVars(P, H, lb=0, ub=GRB.INFINITY, vtype={0}, name="in")
y = model.addVars(H, C, lb=0, ub=GRB.INFINITY, vtype={0}, name="out")
model.setObjective(gp.quicksum(data["inbound_cost"][p][h] * x[p, h] for p in P for h in H)
                   + gp.quicksum(data["outbound_cost"][h][c] * y[h, c] for h in H for c in C), GRB.MINIMIZE)
for p in P:
    model.addConstr(x.sum(p, "*") <= data["supply"][p], name=f"supply_{{p}}")
for h in H:
    model.addConstr(x.sum("*", h) == y.sum(h, "*"), name=f"balance_{{h}}")
    model.addConstr(x.sum("*", h) <= data["throughput"][h], name=f"throughput_{{h}}")
for c in C:
    model.addConstr(y.sum("*", c) >= data["demand"][c], name=f"demand_{{c}}")
model.optimize()
)",
                               integer ? "GRB.INTEGER" : "GRB.CONTINUOUS");
  in.reasoning =
      bullet_reasoning(fmt::format("Transshipment: {} plants -> {} hubs -> {} customers.", np, nw, nc),
                       {"Flow variables on both legs.", "Hubs conserve flow and have a throughput limit.",
                        "Plants respect supply, customers receive their demand.",
                        fmt::format("Total demand {}, total supply {}.", num(dem), num(sup))});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance min_cost_flow(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 4, 5, 6, 8, 9, 14, 15, 25);
  auto V = rng.sample(kPlaces, n);
  auto arcs = graph_with_backbone(rng, n, std::min(0.5, 3.0 / n));
  Instance in;
  in.family = "min_cost_flow";
  in.problem_class = "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["nodes"] = V;
  // Supplies in the first third of the backbone, demands in the last third.
  const int ns = std::max(1, n / 3), nd = std::max(1, n / 3);
  std::vector<double> b(n, 0.0);
  double total = 0;
  for (int i = 0; i < ns; ++i) total += (b[i] = rng.integer(10, 60));
  double left = total;
  for (int k = 0; k < nd; ++k) {
    const int i = n - 1 - k;
    const double v = k + 1 == nd ? left : std::min(left, std::round(total / nd * rng.real(0.6, 1.2, 0.01)));
    b[i] = -v;
    left -= v;
  }
  json al = json::array();
  for (auto [i, j] : arcs) {
    const bool backbone = j == i + 1;
    al.push_back({V[i], V[j]});
    d["cost"][V[i]][V[j]] = backbone ? rng.real(5, 15, 0.5) : rng.real(1, 8, 0.5);
    d["capacity"][V[i]][V[j]] = backbone ? total : rng.integer(5, 40);
  }
  d["arcs"] = al;
  for (int i = 0; i < n; ++i) d["supply"][V[i]] = b[i];
  if (req.target == Expected::Infeasible) {
    const int t = n - 1;  // the last node's inflow is limited to the capacities of its incoming arcs
    double into = 0;
    for (auto [i, j] : arcs)
      if (j == t) into += g(d["capacity"][V[i]][V[j]]);
    const double extra = into - (-b[t]) + rng.integer(1, 20);
    b[t] -= extra;
    b[0] += extra;
    d["supply"][V[t]] = b[t];
    d["supply"][V[0]] = b[0];
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("{} needs {} units but the links into it can carry only {} in total", V[t],
                                   num(-b[t]), num(into));
  }
  static const std::vector<std::string> media = {"regional freight network", "water distribution grid",
                                                 "gas pipeline system", "rail network for containers"};
  in.story = fmt::format(
      "A {} connects {} nodes. Some nodes supply product, some demand it, and the rest are junctions. Each "
      "directed link has a cost per unit and a capacity. All supply must be shipped and all demand met.",
      rng.pick(media), n);
  std::string inl;
  for (int i = 0; i < n; ++i) {
    if (b[i] > 0) inl += fmt::format("{} supplies {} units. ", V[i], num(b[i]));
    if (b[i] < 0) inl += fmt::format("{} demands {} units. ", V[i], num(-b[i]));
  }
  for (auto [i, j] : arcs)
    inl += fmt::format("{} -> {}: {} per unit, capacity {}. ", V[i], V[j], money(g(d["cost"][V[i]][V[j]])),
                       num(g(d["capacity"][V[i]][V[j]])));
  in.inline_data = inl + "Other nodes only pass flow through.";
  Table t1{"Net supply (negative = demand):", {"Node", "Net supply"}, {}};
  for (int i = 0; i < n; ++i) t1.rows.push_back({V[i], num(b[i])});
  Table t2{"Links:", {"From", "To", "Cost ($/unit)", "Capacity"}, {}};
  for (auto [i, j] : arcs)
    t2.rows.push_back({V[i], V[j], num(g(d["cost"][V[i]][V[j]])), num(g(d["capacity"][V[i]][V[j]]))});
  in.tables = {t1, t2};
  in.question = "Find the flow of minimum total cost.";
  in.data_keys = {{"nodes", "list of nodes"},
                  {"arcs", "list of [from, to] links"},
                  {"cost", "cost[from][to] per unit"},
                  {"capacity", "capacity[from][to]"},
                  {"supply", "net supply per node (negative: demand)"}};
  ModelBuilder mb("min_cost_flow", Sense::Minimize);
  std::vector<int> x;
  for (auto [i, j] : arcs) {
    x.push_back(mb.var("flow_" + V[i] + "_" + V[j], 0, g(d["capacity"][V[i]][V[j]])));
    mb.obj(x.back(), g(d["cost"][V[i]][V[j]]));
  }
  for (int v = 0; v < n; ++v) {
    const int r = mb.row("balance_" + V[v], RowSense::EQ, b[v]);
    for (size_t k = 0; k < arcs.size(); ++k) {
      if (arcs[k].first == v) mb.add(r, x[k], 1);
      if (arcs[k].second == v) mb.add(r, x[k], -1);
    }
  }
  in.model = mb.take();
  in.mathprog = R"(set nodes; set arcs within nodes cross nodes;
param cost{arcs}; param capacity{arcs}; param supply{nodes};
var flow{(i,j) in arcs} >= 0, <= capacity[i,j];
minimize total_cost: sum{(i,j) in arcs} cost[i,j] * flow[i,j];
s.t. conserve{v in nodes}: sum{(a,j) in arcs: a = v} flow[a,j] - sum{(i,b) in arcs: b = v} flow[i,b] = supply[v];
)";
  in.formulation = R"(Sets:
- N: nodes; A: directed links.
Parameters:
- c_(i,j) unit cost; u_(i,j) capacity; b_v net supply (positive: supply, negative: demand).
Decision variables:
- x_(i,j): flow on link (i, j), 0 <= x_(i,j) <= u_(i,j), continuous.
Objective:
- minimize sum_((i,j) in A) c_(i,j) * x_(i,j)
Constraints:
- conservation: sum_j x_(v,j) - sum_i x_(i,v) = b_v for every node v)";
  in.python_body = R"(N = data["nodes"]
A = [tuple(a) for a in data["arcs"]]
model = gp.Model("min_cost_flow")
x = model.addVars(A, lb=0, ub={(i, j): data["capacity"][i][j] for (i, j) in A}, name="flow")
model.setObjective(gp.quicksum(data["cost"][i][j] * x[i, j] for (i, j) in A), GRB.MINIMIZE)
for v in N:
    model.addConstr(gp.quicksum(x[i, j] for (i, j) in A if i == v) - gp.quicksum(x[i, j] for (i, j) in A if j == v)
                    == data["supply"][v], name=f"balance_{v}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Capacitated min-cost flow on {} nodes and {} links.", n, arcs.size()),
      {"Flow variables bounded by link capacities.", "Minimise total transport cost.",
       "One conservation equation per node with the node's net supply; supplies and demands balance."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance multi_commodity_flow(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 4, 5, 5, 7, 8, 11, 12, 16);
  const int K = size_for(rng, req.difficulty, 2, 2, 2, 3, 3, 4, 4, 6);
  auto V = rng.sample(kPlaces, n);
  auto arcs = graph_with_backbone(rng, n, std::min(0.5, 3.0 / n));
  Instance in;
  in.family = "multi_commodity_flow";
  in.problem_class = "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["nodes"] = V;
  std::vector<std::string> Kn;
  static const std::vector<std::string> goods = {"Electronics", "Produce", "Textiles",  "Chemicals",
                                                 "Furniture",   "Paper",   "Machinery", "Beverages"};
  Kn = rng.sample(goods, K);
  d["commodities"] = Kn;
  double total = 0;
  std::vector<std::string> desc;
  for (auto& k : Kn) {
    const int o = rng.integer(0, n / 2 - 1 < 0 ? 0 : n / 2 - 1);
    const int t = rng.integer(std::max(o + 1, n / 2), n - 1);
    const double amt = rng.integer(5, 50);
    total += amt;
    d["supply"][k][V[o]] = amt;
    d["supply"][k][V[t]] = -amt;
    desc.push_back(fmt::format("{} units of {} from {} to {}", num(amt), k, V[o], V[t]));
  }
  json al = json::array();
  for (auto [i, j] : arcs) {
    const bool backbone = j == i + 1;
    al.push_back({V[i], V[j]});
    d["cost"][V[i]][V[j]] = backbone ? rng.real(6, 15, 0.5) : rng.real(1, 6, 0.5);
    d["capacity"][V[i]][V[j]] = backbone ? total : rng.integer(5, 30);
  }
  d["arcs"] = al;
  in.story = fmt::format(
      "A logistics provider must route {} commodities through a network of {} terminals. Every link has one "
      "capacity shared by all commodities and a cost per unit that does not depend on the commodity.",
      K, n);
  std::string inl = "Shipments required: " + join_and(desc) + ". ";
  for (auto [i, j] : arcs)
    inl += fmt::format("{} -> {} costs {} per unit and carries at most {} units in total. ", V[i], V[j],
                       money(g(d["cost"][V[i]][V[j]])), num(g(d["capacity"][V[i]][V[j]])));
  in.inline_data = inl;
  Table t1{"Shipments:", {"Commodity", "From", "To", "Units"}, {}};
  for (auto& k : Kn) {
    std::string from, to;
    double amt = 0;
    for (auto& [v, s] : d["supply"][k].items()) {
      if (g(s) > 0)
        from = v, amt = g(s);
      else
        to = v;
    }
    t1.rows.push_back({k, from, to, num(amt)});
  }
  Table t2{"Links:", {"From", "To", "Cost ($/unit)", "Joint capacity"}, {}};
  for (auto [i, j] : arcs)
    t2.rows.push_back({V[i], V[j], num(g(d["cost"][V[i]][V[j]])), num(g(d["capacity"][V[i]][V[j]]))});
  in.tables = {t1, t2};
  in.question = "Route every shipment at minimum total cost. Flows may be split across paths.";
  in.data_keys = {
      {"nodes", "terminals"},
      {"commodities", "commodities"},
      {"arcs", "list of [from, to] links"},
      {"cost", "cost[from][to] per unit"},
      {"capacity", "joint capacity[from][to]"},
      {"supply", "supply[commodity][node]: +units at the origin, -units at the destination, absent = 0"}};
  ModelBuilder mb("multi_commodity_flow", Sense::Minimize);
  std::map<std::pair<std::string, size_t>, int> x;
  for (auto& k : Kn)
    for (size_t a = 0; a < arcs.size(); ++a) {
      const auto [i, j] = arcs[a];
      mb.obj(x[{k, a}] = mb.var("flow_" + k + "_" + V[i] + "_" + V[j]), g(d["cost"][V[i]][V[j]]));
    }
  for (auto& k : Kn)
    for (int v = 0; v < n; ++v) {
      const double s = d["supply"][k].contains(V[v]) ? g(d["supply"][k][V[v]]) : 0.0;
      const int r = mb.row("balance_" + k + "_" + V[v], RowSense::EQ, s);
      for (size_t a = 0; a < arcs.size(); ++a) {
        if (arcs[a].first == v) mb.add(r, x[{k, a}], 1);
        if (arcs[a].second == v) mb.add(r, x[{k, a}], -1);
      }
    }
  for (size_t a = 0; a < arcs.size(); ++a) {
    const auto [i, j] = arcs[a];
    const int r = mb.row("capacity_" + V[i] + "_" + V[j], RowSense::LE, g(d["capacity"][V[i]][V[j]]));
    for (auto& k : Kn) mb.add(r, x[{k, a}], 1);
  }
  in.model = mb.take();
  in.mathprog = R"(set nodes; set commodities; set arcs within nodes cross nodes;
param cost{arcs}; param capacity{arcs}; param supply{commodities, nodes} default 0;
var flow{commodities, arcs} >= 0;
minimize total_cost: sum{k in commodities, (i,j) in arcs} cost[i,j] * flow[k,i,j];
s.t. conserve{k in commodities, v in nodes}:
  sum{(a,j) in arcs: a = v} flow[k,a,j] - sum{(i,b) in arcs: b = v} flow[k,i,b] = supply[k,v];
s.t. joint{(i,j) in arcs}: sum{k in commodities} flow[k,i,j] <= capacity[i,j];
)";
  in.formulation = R"(Sets:
- N: nodes; A: links; K: commodities.
Parameters:
- c_(i,j) unit cost; u_(i,j) joint capacity; b_(k,v) net supply of commodity k at node v.
Decision variables:
- x_(k,i,j) >= 0: flow of commodity k on link (i, j), continuous.
Objective:
- minimize sum_k sum_((i,j) in A) c_(i,j) * x_(k,i,j)
Constraints:
- conservation per commodity: sum_j x_(k,v,j) - sum_i x_(k,i,v) = b_(k,v)
- joint capacity: sum_k x_(k,i,j) <= u_(i,j))";
  in.python_body = R"(N = data["nodes"]
K = data["commodities"]
A = [tuple(a) for a in data["arcs"]]
model = gp.Model("multi_commodity_flow")
x = model.addVars([(k, i, j) for k in K for (i, j) in A], lb=0, ub=GRB.INFINITY, name="flow")
model.setObjective(gp.quicksum(data["cost"][i][j] * x[k, i, j] for k in K for (i, j) in A), GRB.MINIMIZE)
for k in K:
    for v in N:
        model.addConstr(gp.quicksum(x[k, i, j] for (i, j) in A if i == v)
                        - gp.quicksum(x[k, i, j] for (i, j) in A if j == v)
                        == data["supply"][k].get(v, 0), name=f"balance_{k}_{v}")
for (i, j) in A:
    model.addConstr(gp.quicksum(x[k, i, j] for k in K) <= data["capacity"][i][j], name=f"capacity_{i}_{j}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Multi-commodity flow: {} commodities on {} nodes and {} links.", K, n, arcs.size()),
      {"One flow variable per commodity and link.", "Conservation per commodity and node.",
       "Links share one capacity across commodities; this coupling is what makes the problem harder than K "
       "separate shortest paths."});
  return in;
}

}  // namespace

void add_flow_families(std::vector<Family>& out) {
  out.push_back({"transshipment", "transportation", true, false, &transshipment});
  out.push_back({"min_cost_flow", "network_flow", true, false, &min_cost_flow});
  out.push_back({"multi_commodity_flow", "network_flow", false, false, &multi_commodity_flow});
}

}  // namespace trex::orkit::gen
