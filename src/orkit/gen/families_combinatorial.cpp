// Combinatorial families: knapsack, set covering, facility location (uncapacitated and capacitated),
// bin packing.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

// ------------------------------------------------------------------------------------------------
Instance knapsack(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 4, 6, 7, 12, 15, 30, 35, 60);
  const int dims = rng.chance(0.35) ? 2 : 1;
  struct Theme {
    std::string story, item, value, cap1, unit1, cap2, unit2;
  };
  static const std::vector<Theme> themes = {
      {"An investment committee is choosing which projects to fund this year.", "Project", "net present value ($k)",
       "budget", "$k", "engineering staff", "person-months"},
      {"A hiker is packing a backpack for a trip.", "Item", "usefulness score", "weight limit", "kg", "volume",
       "litres"},
      {"A satellite operator selects experiments for the next launch.", "Experiment", "science value", "payload mass",
       "kg", "power", "watts"},
      {"A broadcaster picks advertising slots for a campaign.", "Slot", "expected reach (thousands)", "budget", "$k",
       "airtime", "seconds"}};
  const Theme& th = rng.pick(themes);
  std::vector<std::string> items;
  for (int i = 0; i < n; ++i) items.push_back(fmt::format("{}{}", th.item, i + 1));
  Instance in;
  in.family = "knapsack";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = th.value;
  json& d = in.data;
  d["items"] = items;
  std::vector<std::string> dimn = {th.cap1};
  if (dims == 2) dimn.push_back(th.cap2);
  d["resources"] = dimn;
  for (auto& i : items) d["value"][i] = rng.integer(5, 100);
  for (auto& r : dimn) {
    double tot = 0;
    for (auto& i : items) {
      d["weight"][r][i] = rng.integer(2, 40);
      tot += d["weight"][r][i].get<double>();
    }
    d["capacity"][r] = std::round(tot * rng.real(0.3, 0.6, 0.01));
  }
  in.story = th.story + fmt::format(" There are {} candidates; each can be chosen at most once.", n);
  std::string inl;
  for (auto& i : items) {
    std::vector<std::string> w;
    w.push_back(fmt::format("{} {} of {}", num(d["weight"][th.cap1][i].get<double>()), th.unit1, th.cap1));
    if (dims == 2) w.push_back(fmt::format("{} {} of {}", num(d["weight"][th.cap2][i].get<double>()), th.unit2, th.cap2));
    inl += fmt::format("{} has a {} of {} and needs {}. ", i, th.value, num(d["value"][i].get<double>()), join_and(w));
  }
  inl += fmt::format("The {} is {} {}", th.cap1, num(d["capacity"][th.cap1].get<double>()), th.unit1);
  if (dims == 2) inl += fmt::format(" and the {} available is {} {}", th.cap2, num(d["capacity"][th.cap2].get<double>()), th.unit2);
  in.inline_data = inl + ".";
  Table t{"Candidates:", {th.item, capitalize(th.value), capitalize(th.cap1) + " (" + th.unit1 + ")"}, {}};
  if (dims == 2) t.header.push_back(capitalize(th.cap2) + " (" + th.unit2 + ")");
  for (auto& i : items) {
    std::vector<std::string> row{i, num(d["value"][i].get<double>()), num(d["weight"][th.cap1][i].get<double>())};
    if (dims == 2) row.push_back(num(d["weight"][th.cap2][i].get<double>()));
    t.rows.push_back(row);
  }
  in.tables = {t};
  in.table_lead = fmt::format("Available {}: {} {}.", th.cap1, num(d["capacity"][th.cap1].get<double>()), th.unit1) +
                  (dims == 2 ? fmt::format(" Available {}: {} {}.", th.cap2, num(d["capacity"][th.cap2].get<double>()), th.unit2) : "");
  in.question = fmt::format("Which candidates should be selected to maximise the total {}?", th.value);
  in.data_keys = {{"items", "list of candidate names"}, {"resources", "list of limited resources"},
                  {"value", "value of each item"}, {"weight", "weight[resource][item]"},
                  {"capacity", "capacity of each resource"}};
  ModelBuilder mb("knapsack", Sense::Maximize);
  std::map<std::string, int> x;
  for (auto& i : items) {
    x[i] = mb.binary("x_" + i);
    mb.obj(x[i], d["value"][i].get<double>());
  }
  for (auto& r : dimn) {
    int row = mb.row("cap_" + r, RowSense::LE, d["capacity"][r].get<double>());
    for (auto& i : items) mb.add(row, x[i], d["weight"][r][i].get<double>());
  }
  in.model = mb.take();
  in.mathprog = R"(set items; set resources;
param value{items}; param weight{resources, items}; param capacity{resources};
var x{items} binary;
maximize total_value: sum{i in items} value[i] * x[i];
s.t. cap{r in resources}: sum{i in items} weight[r,i] * x[i] <= capacity[r];
)";
  in.formulation = R"(Sets:
- I: candidate items; R: limited resources.
Parameters:
- v_i: value of item i; w_(r,i): use of resource r by item i; C_r: amount of resource r available.
Decision variables:
- x_i binary: 1 if item i is selected.
Objective:
- maximize sum_(i in I) v_i * x_i
Constraints:
- capacity: sum_(i in I) w_(r,i) * x_i <= C_r for every r in R)";
  in.python_body = R"(I = data["items"]
R = data["resources"]
model = gp.Model("knapsack")
x = model.addVars(I, lb=0, ub=1, vtype=GRB.BINARY, name="x")
model.setObjective(gp.quicksum(data["value"][i] * x[i] for i in I), GRB.MAXIMIZE)
for r in R:
    model.addConstr(gp.quicksum(data["weight"][r][i] * x[i] for i in I) <= data["capacity"][r], name=f"cap_{r}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("A {}0-1 knapsack problem with {} items.", dims == 2 ? "two-dimensional " : "", n),
      {"Binary x_i for each candidate (chosen at most once).", "Maximise the total value.",
       fmt::format("{} capacity row{}.", dims, dims == 2 ? "s" : "")});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance set_covering(Rng& rng, const GenRequest& req) {
  const int nz = size_for(rng, req.difficulty, 4, 6, 7, 12, 14, 25, 30, 50);
  const int ns = size_for(rng, req.difficulty, 4, 5, 6, 10, 12, 20, 25, 40);
  struct Theme {
    std::string site, zone, story;
  };
  static const std::vector<Theme> themes = {
      {"Station", "District", "A city plans fire stations so that every district is reached within 8 minutes."},
      {"Tower", "Village", "A telecom operator chooses cell-tower sites so that every village has coverage."},
      {"Depot", "Suburb", "An ambulance service picks depots so every suburb is within the response-time target."},
      {"Camera", "Corridor", "A warehouse installs cameras so that every corridor is watched by at least one."}};
  const Theme& th = rng.pick(themes);
  std::vector<std::string> Z, S;
  for (int i = 0; i < nz; ++i) Z.push_back(fmt::format("{}{}", th.zone, i + 1));
  for (int i = 0; i < ns; ++i) S.push_back(fmt::format("{}{}", th.site, (char)('A' + i % 26)) + (i >= 26 ? std::to_string(i / 26) : ""));
  Instance in;
  in.family = "set_covering";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "thousand dollars";
  json& d = in.data;
  d["zones"] = Z;
  d["sites"] = S;
  std::map<std::string, std::vector<std::string>> cov;
  for (auto& s : S)
    for (auto& z : Z)
      if (rng.chance(std::min(0.5, 3.0 / ns + 0.15))) cov[s].push_back(z);
  const bool infeasible = req.target == Expected::Infeasible;
  std::string uncovered;
  if (infeasible) {
    uncovered = Z[rng.integer(0, nz - 1)];
    for (auto& [s, zs] : cov) std::erase(zs, uncovered);
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("no candidate {} covers {}", th.site, uncovered);
  } else {
    for (auto& z : Z) {  // every zone covered by at least one site
      bool ok = false;
      for (auto& [s, zs] : cov) ok = ok || std::find(zs.begin(), zs.end(), z) != zs.end();
      if (!ok) cov[S[rng.integer(0, ns - 1)]].push_back(z);
    }
  }
  for (auto& s : S) {
    auto zs = cov[s];
    std::sort(zs.begin(), zs.end(), [&](const std::string& a, const std::string& b) {
      return std::find(Z.begin(), Z.end(), a) < std::find(Z.begin(), Z.end(), b);
    });
    d["covers"][s] = zs;
    d["cost"][s] = rng.integer(20, 120);
  }
  in.story = th.story + fmt::format(" There are {} candidate {} sites and {} {}s.", ns, th.site, nz, th.zone);
  std::string inl;
  for (auto& s : S)
    inl += fmt::format("{} costs ${}k and covers {}. ", s, num(d["cost"][s].get<double>()),
                       d["covers"][s].empty() ? std::string("no ") + th.zone : join_and(d["covers"][s].get<std::vector<std::string>>()));
  in.inline_data = inl;
  Table t{"Candidate sites:", {th.site, "Cost ($k)", "Covers"}, {}};
  for (auto& s : S)
    t.rows.push_back({s, num(d["cost"][s].get<double>()), join(d["covers"][s].get<std::vector<std::string>>(), ", ")});
  in.tables = {t};
  in.question = fmt::format("Which sites should be opened so that every {} is covered at minimum total cost?", th.zone);
  in.data_keys = {{"zones", "list of zones that must be covered"}, {"sites", "list of candidate sites"},
                  {"covers", "covers[site]: list of zones the site covers"}, {"cost", "cost of opening each site"}};
  ModelBuilder mb("set_covering", Sense::Minimize);
  std::map<std::string, int> y;
  for (auto& s : S) {
    y[s] = mb.binary("y_" + s);
    mb.obj(y[s], d["cost"][s].get<double>());
  }
  for (auto& z : Z) {
    int r = mb.row("cover_" + z, RowSense::GE, 1);
    for (auto& s : S)
      for (auto& zz : d["covers"][s])
        if (zz == z) mb.add(r, y[s], 1);
  }
  in.model = mb.take();
  in.mathprog = R"(set zones; set sites;
set covers{sites} within zones;
param cost{sites};
var y{sites} binary;
minimize total_cost: sum{s in sites} cost[s] * y[s];
s.t. cover{z in zones}: sum{s in sites: z in covers[s]} y[s] >= 1;
)";
  in.formulation = R"(Sets:
- Z: zones; S: candidate sites; Z_s: zones covered by site s.
Parameters:
- c_s: cost of opening site s.
Decision variables:
- y_s binary: 1 if site s is opened.
Objective:
- minimize sum_(s in S) c_s * y_s
Constraints:
- coverage: sum_(s in S : z in Z_s) y_s >= 1 for every zone z)";
  in.python_body = R"(Z = data["zones"]
S = data["sites"]
model = gp.Model("set_covering")
y = model.addVars(S, lb=0, ub=1, vtype=GRB.BINARY, name="y")
model.setObjective(gp.quicksum(data["cost"][s] * y[s] for s in S), GRB.MINIMIZE)
for z in Z:
    model.addConstr(gp.quicksum(y[s] for s in S if z in data["covers"][s]) >= 1, name=f"cover_{z}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(fmt::format("A set-covering problem: {} sites, {} zones.", ns, nz),
                                  {"Binary y_s: open site s or not.", "Minimise the total opening cost.",
                                   "Each zone needs at least one open site that covers it."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance facility_location(Rng& rng, const GenRequest& req, bool capacitated) {
  const int nf = size_for(rng, req.difficulty, 2, 3, 3, 5, 5, 8, 8, 12);
  const int nc = size_for(rng, req.difficulty, 3, 5, 5, 8, 10, 18, 20, 35);
  static const std::vector<std::string> sites = {"Northgate", "Eastfield", "Southport", "Westbrook", "Riverside",
                                                 "Hillcrest", "Lakeview", "Oakridge", "Pinewood", "Stonebridge",
                                                 "Fairview", "Brookside", "Maple", "Cedar"};
  auto F = rng.sample(sites, nf);
  std::vector<std::string> C;
  for (int j = 0; j < nc; ++j) C.push_back(fmt::format("Store{}", j + 1));
  Instance in;
  in.family = capacitated ? "capacitated_facility_location" : "uncapacitated_facility_location";
  in.problem_class = capacitated || rng.chance(0.5) ? "MILP" : "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["facilities"] = F;
  d["customers"] = C;
  double tot = 0;
  for (auto& c : C) {
    d["demand"][c] = rng.integer(10, 80);
    tot += d["demand"][c].get<double>();
  }
  for (auto& f : F) d["fixed_cost"][f] = rng.integer(200, 1500) * 10;
  for (auto& f : F)
    for (auto& c : C) d["unit_cost"][f][c] = rng.real(1, 20, 0.5);
  const bool infeasible = capacitated && req.target == Expected::Infeasible;
  double totcap = 0;
  if (capacitated) {
    for (auto& f : F) {
      d["capacity"][f] = std::round(tot * (infeasible ? 0.8 : rng.real(0.4, 0.9, 0.01)) / nf * (infeasible ? 1.0 : 2.0));
      totcap += d["capacity"][f].get<double>();
    }
    if (!infeasible && totcap < tot) {
      d["capacity"][F[0]] = d["capacity"][F[0]].get<double>() + tot - totcap + 10;
      totcap = tot + 10;
    }
    if (infeasible) {
      in.expected = Expected::Infeasible;
      in.status_reason = fmt::format("even with every warehouse open the total capacity {} is below the total demand {}",
                                     num(totcap), num(tot));
    }
  }
  in.story = fmt::format(
      "A retailer can open distribution warehouses at {} candidate sites ({}) to serve {} stores. Opening a site "
      "has a fixed cost; serving a store's demand from a site costs a per-unit delivery cost.{}",
      nf, join_and(F), nc, capacitated ? " Each warehouse has a limited capacity." : " Warehouses have ample capacity.");
  std::string inl;
  for (auto& f : F)
    inl += fmt::format("Opening {} costs {}{}. ", f, money(d["fixed_cost"][f].get<double>()),
                       capacitated ? fmt::format(" and it can ship at most {} units", num(d["capacity"][f].get<double>())) : "");
  for (auto& c : C) inl += fmt::format("{} needs {} units. ", c, num(d["demand"][c].get<double>()));
  for (auto& f : F) {
    std::vector<std::string> v;
    for (auto& c : C) v.push_back(fmt::format("{} to {}", money(d["unit_cost"][f][c].get<double>()), c));
    inl += fmt::format("Delivering one unit from {} costs {}. ", f, join_and(v));
  }
  in.inline_data = inl;
  Table t1{"Per-unit delivery cost ($):", {"Site \\ Store"}, {}};
  for (auto& c : C) t1.header.push_back(c);
  for (auto& f : F) {
    std::vector<std::string> row{f};
    for (auto& c : C) row.push_back(num(d["unit_cost"][f][c].get<double>()));
    t1.rows.push_back(row);
  }
  Table t2{"Sites:", {"Site", "Fixed cost ($)"}, {}};
  if (capacitated) t2.header.push_back("Capacity (units)");
  for (auto& f : F) {
    std::vector<std::string> row{f, num(d["fixed_cost"][f].get<double>())};
    if (capacitated) row.push_back(num(d["capacity"][f].get<double>()));
    t2.rows.push_back(row);
  }
  Table t3{"Store demand (units):", {"Store", "Demand"}, {}};
  for (auto& c : C) t3.rows.push_back({c, num(d["demand"][c].get<double>())});
  in.tables = {t2, t3, t1};
  in.question = "Which warehouses should be opened, and how should demand be served, to minimise fixed plus "
                "delivery cost? Demand may be split between warehouses.";
  in.data_keys = {{"facilities", "candidate sites"}, {"customers", "stores"}, {"demand", "demand of each store"},
                  {"fixed_cost", "cost of opening each site"}, {"unit_cost", "unit_cost[site][store]"}};
  if (capacitated) in.data_keys.push_back({"capacity", "capacity of each site"});
  ModelBuilder mb(in.family, Sense::Minimize);
  std::map<std::string, int> y;
  std::map<std::pair<std::string, std::string>, int> x;
  for (auto& f : F) {
    y[f] = mb.binary("open_" + f);
    mb.obj(y[f], d["fixed_cost"][f].get<double>());
  }
  for (auto& f : F)
    for (auto& c : C) {
      x[{f, c}] = mb.var("ship_" + f + "_" + c);
      mb.obj(x[{f, c}], d["unit_cost"][f][c].get<double>());
    }
  for (auto& c : C) {
    int r = mb.row("demand_" + c, RowSense::EQ, d["demand"][c].get<double>());
    for (auto& f : F) mb.add(r, x[{f, c}], 1);
  }
  for (auto& f : F)
    for (auto& c : C) {  // ship only from open sites
      int r = mb.row("link_" + f + "_" + c, RowSense::LE, 0);
      mb.add(r, x[{f, c}], 1);
      mb.add(r, y[f], -d["demand"][c].get<double>());
    }
  if (capacitated)
    for (auto& f : F) {
      int r = mb.row("capacity_" + f, RowSense::LE, 0);
      for (auto& c : C) mb.add(r, x[{f, c}], 1);
      mb.add(r, y[f], -d["capacity"][f].get<double>());
    }
  in.model = mb.take();
  in.mathprog = std::string(R"(set facilities; set customers;
param demand{customers}; param fixed_cost{facilities}; param unit_cost{facilities, customers};
)") + (capacitated ? "param capacity{facilities};\n" : "") + R"(var open{facilities} binary;
var ship{facilities, customers} >= 0;
minimize total_cost: sum{f in facilities} fixed_cost[f] * open[f]
  + sum{f in facilities, c in customers} unit_cost[f,c] * ship[f,c];
s.t. serve{c in customers}: sum{f in facilities} ship[f,c] = demand[c];
s.t. link{f in facilities, c in customers}: ship[f,c] <= demand[c] * open[f];
)" + (capacitated ? "s.t. cap{f in facilities}: sum{c in customers} ship[f,c] <= capacity[f] * open[f];\n" : "");
  in.formulation = std::string(R"(Sets:
- F: candidate sites; C: stores.
Parameters:
- f_i: fixed cost of site i; c_(i,j): unit delivery cost from i to j; d_j: demand of store j)") +
                   (capacitated ? "; Q_i: capacity of site i" : "") + R"(.
Decision variables:
- y_i binary: 1 if site i is opened; x_(i,j) >= 0 continuous: units delivered from i to j.
Objective:
- minimize sum_i f_i * y_i + sum_(i,j) c_(i,j) * x_(i,j)
Constraints:
- demand: sum_i x_(i,j) = d_j for every store j
- linking: x_(i,j) <= d_j * y_i for every i, j (strong formulation))" +
                   (capacitated ? "\n- capacity: sum_j x_(i,j) <= Q_i * y_i for every site i" : "");
  in.python_body = std::string(R"(F = data["facilities"]
C = data["customers"]
model = gp.Model("facility_location")
y = model.addVars(F, lb=0, ub=1, vtype=GRB.BINARY, name="open")
x = model.addVars(F, C, lb=0, ub=GRB.INFINITY, name="ship")
model.setObjective(gp.quicksum(data["fixed_cost"][i] * y[i] for i in F)
                   + gp.quicksum(data["unit_cost"][i][j] * x[i, j] for i in F for j in C), GRB.MINIMIZE)
for j in C:
    model.addConstr(x.sum("*", j) == data["demand"][j], name=f"demand_{j}")
for i in F:
    for j in C:
        model.addConstr(x[i, j] <= data["demand"][j] * y[i], name=f"link_{i}_{j}")
)") + (capacitated ? R"(for i in F:
    model.addConstr(x.sum(i, "*") <= data["capacity"][i] * y[i], name=f"capacity_{i}")
)"
                                     : "") +
                   "model.optimize()\n";
  in.reasoning = bullet_reasoning(
      fmt::format("{} facility location with {} candidate sites and {} stores.",
                  capacitated ? "Capacitated" : "Uncapacitated", nf, nc),
      {"Binary open decisions y_i and continuous flows x_(i,j) (demand may be split).",
       "Objective: fixed opening costs plus delivery costs.", "Every store's demand is met exactly.",
       "Linking rows x_(i,j) <= d_j y_i forbid deliveries from closed sites (tighter than one big-M row per site).",
       capacitated ? "Capacity rows sum_j x_(i,j) <= Q_i y_i." : "No capacity limits."});
  return in;
}
Instance ufl(Rng& rng, const GenRequest& req) { return facility_location(rng, req, false); }
Instance cfl(Rng& rng, const GenRequest& req) { return facility_location(rng, req, true); }

// ------------------------------------------------------------------------------------------------
Instance bin_packing(Rng& rng, const GenRequest& req) {
  const int n = size_for(rng, req.difficulty, 4, 5, 5, 7, 7, 9, 9, 11);
  static const std::vector<std::array<std::string, 3>> themes = {{"parcel", "truck", "kg"},
                                                                  {"file", "disk", "GB"},
                                                                  {"crate", "container", "cubic metres"},
                                                                  {"job", "server", "GB of memory"}};
  const auto& th = rng.pick(themes);
  std::vector<std::string> items;
  for (int i = 0; i < n; ++i) items.push_back(fmt::format("{}{}", capitalize(th[0]), i + 1));
  const int cap = rng.integer(10, 20) * 5;
  Instance in;
  in.family = "bin_packing";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = th[1] + "s";
  json& d = in.data;
  d["items"] = items;
  double tot = 0;
  for (auto& i : items) {
    d["size"][i] = rng.integer(cap / 6, cap * 3 / 5);
    tot += d["size"][i].get<double>();
  }
  d["capacity"] = cap;
  const int nb = std::min(n, static_cast<int>(std::ceil(tot / cap)) + 2);
  std::vector<std::string> bins;
  for (int b = 0; b < nb; ++b) bins.push_back(fmt::format("{}{}", capitalize(th[1]), b + 1));
  d["bins"] = bins;
  for (int b = 0; b < nb; ++b) d["rank"][bins[b]] = b + 1;
  in.story = fmt::format("{} {}s must be packed into identical {}s, each holding at most {} {}. {} {}s are "
                         "available.",
                         n, th[0], th[1], cap, th[2], nb, th[1]);
  std::vector<std::string> sz;
  for (auto& i : items) sz.push_back(fmt::format("{} is {} {}", i, num(d["size"][i].get<double>()), th[2]));
  in.inline_data = capitalize(join_and(sz)) + ".";
  Table t{"Item sizes (" + th[2] + "):", {capitalize(th[0]), "Size"}, {}};
  for (auto& i : items) t.rows.push_back({i, num(d["size"][i].get<double>())});
  in.tables = {t};
  in.question = fmt::format("What is the minimum number of {}s needed to pack every {}?", th[1], th[0]);
  in.data_keys = {{"items", "list of items"}, {"size", "size of each item"}, {"capacity", "capacity of one bin"},
                  {"bins", "list of available bins"},
                  {"rank", "position of each bin in the list (1, 2, ...)"}};
  ModelBuilder mb("bin_packing", Sense::Minimize);
  std::map<std::string, int> y;
  std::map<std::pair<std::string, std::string>, int> x;
  for (auto& b : bins) {
    y[b] = mb.binary("use_" + b);
    mb.obj(y[b], 1);
  }
  for (auto& i : items)
    for (auto& b : bins) x[{i, b}] = mb.binary("put_" + i + "_" + b);
  for (auto& i : items) {
    int r = mb.row("pack_" + i, RowSense::EQ, 1);
    for (auto& b : bins) mb.add(r, x[{i, b}], 1);
  }
  for (auto& b : bins) {
    int r = mb.row("cap_" + b, RowSense::LE, 0);
    for (auto& i : items) mb.add(r, x[{i, b}], d["size"][i].get<double>());
    mb.add(r, y[b], -cap);
  }
  for (size_t k = 0; k + 1 < bins.size(); ++k) {  // symmetry breaking: use bins in order
    int r = mb.row("order_" + bins[k + 1], RowSense::LE, 0);
    mb.add(r, y[bins[k + 1]], 1);
    mb.add(r, y[bins[k]], -1);
  }
  in.model = mb.take();
  in.mathprog = R"(set items; set bins;
param size{items}; param capacity; param rank{bins};
var use{bins} binary;
var put{items, bins} binary;
minimize used: sum{b in bins} use[b];
s.t. pack{i in items}: sum{b in bins} put[i,b] = 1;
s.t. cap{b in bins}: sum{i in items} size[i] * put[i,b] <= capacity * use[b];
s.t. order{b in bins, c in bins: rank[c] = rank[b] - 1}: use[b] <= use[c];
)";
  in.formulation = R"(Sets:
- I: items; B: available bins (ordered).
Parameters:
- s_i: size of item i; Q: bin capacity.
Decision variables:
- y_b binary: bin b is used; x_(i,b) binary: item i goes into bin b.
Objective:
- minimize sum_b y_b
Constraints:
- each item packed once: sum_b x_(i,b) = 1
- capacity: sum_i s_i * x_(i,b) <= Q * y_b
- symmetry breaking: y_b <= y_(b-1) (bins are used in order))";
  in.python_body = R"(I = data["items"]
B = data["bins"]
Q = data["capacity"]
model = gp.Model("bin_packing")
y = model.addVars(B, lb=0, ub=1, vtype=GRB.BINARY, name="use")
x = model.addVars(I, B, lb=0, ub=1, vtype=GRB.BINARY, name="put")
model.setObjective(y.sum(), GRB.MINIMIZE)
for i in I:
    model.addConstr(x.sum(i, "*") == 1, name=f"pack_{i}")
for b in B:
    model.addConstr(gp.quicksum(data["size"][i] * x[i, b] for i in I) <= Q * y[b], name=f"cap_{b}")
for k in range(1, len(B)):
    model.addConstr(y[B[k]] <= y[B[k - 1]], name=f"order_{B[k]}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Bin packing: {} items of total size {} into bins of capacity {}; lower bound ceil({}/{}) = {}.", n,
                  num(tot), cap, num(tot), cap, static_cast<int>(std::ceil(tot / cap))),
      {"Binary y_b (bin used) and x_(i,b) (item in bin).", "Minimise the number of bins used.",
       "Each item in exactly one bin; capacity rows switch a bin on when it holds anything.",
       "Order the bins (y_b <= y_(b-1)) to cut symmetric solutions."});
  return in;
}

}  // namespace

void add_combinatorial_families(std::vector<Family>& out) {
  out.push_back({"knapsack", "selection_knapsack", false, false, &knapsack});
  out.push_back({"set_covering", "covering_set", true, false, &set_covering});
  out.push_back({"uncapacitated_facility_location", "facility_location", false, false, &ufl});
  out.push_back({"capacitated_facility_location", "facility_location", true, false, &cfl});
  out.push_back({"bin_packing", "packing_cutting", false, false, &bin_packing});
}

}  // namespace trex::orkit::gen
