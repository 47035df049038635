// Planning families: crop planning (acreage LP), media/advertising allocation (reach under a budget) and
// multi-period capacity planning (integer expansion modules with outsourcing).
#include <fmt/format.h>

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

// ------------------------------------------------------------------------------------------------
Instance crop_planning(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> pool = {"Wheat",   "Corn",       "Soybeans",  "Barley",
                                                "Canola",  "Potatoes",   "Sunflower", "Oats",
                                                "Alfalfa", "Sugar_beet", "Cotton",    "Rice"};
  const int n = size_for(rng, req.difficulty, 2, 3, 3, 5, 6, 8, 9, 12);
  auto C = rng.sample(pool, n);
  const bool hectares = rng.chance(0.4);
  const std::string area = hectares ? "hectare" : "acre";
  Instance in;
  in.family = "crop_planning";
  in.problem_class = "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["crops"] = C;
  const double land = rng.integer(20, 200) * 10;
  d["land"] = land;
  double water_need = 0, labour_need = 0;
  for (auto& c : C) {
    d["yield"][c] = rng.real(1, 12, 0.1);
    d["price"][c] = rng.real(80, 400, 5);
    d["cost"][c] = rng.real(100, 600, 10);
    d["water"][c] = rng.real(5, 30, 0.5);
    d["labour"][c] = rng.real(2, 20, 0.5);
    water_need += g(d["water"][c]);
    labour_need += g(d["labour"][c]);
  }
  // Resources cover only part of the land planted with an average crop, so they bind.
  d["water_available"] = std::round(land * water_need / n * rng.real(0.5, 0.9, 0.01));
  d["labour_available"] = std::round(land * labour_need / n * rng.real(0.5, 0.9, 0.01));
  for (auto& c : C)
    if (rng.chance(0.3)) d["max_area"][c] = std::round(land * rng.real(0.1, 0.4, 0.01));
  const bool infeasible = req.target == Expected::Infeasible;
  if (infeasible) {
    double total = 0;
    for (auto& c : C) {
      d["min_area"][c] = std::ceil(land * rng.real(1.1, 1.4, 0.01) / n);
      if (d.contains("max_area") && d["max_area"].contains(c)) d["max_area"].erase(c);
      total += g(d["min_area"][c]);
    }
    if (d.contains("max_area") && d["max_area"].empty()) d.erase("max_area");
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("the contracted minimum areas add up to {} {}s but the farm has only {}",
                                   num(total), area, num(land));
  } else {
    // A small contract for one crop: the reference plan (that area of the crop, nothing else) fits the
    // land, water and labour limits.
    if (rng.chance(0.5)) {
      const std::string& c = C[rng.integer(0, n - 1)];
      double a = std::floor(std::min({land * 0.1, g(d["water_available"]) * 0.1 / g(d["water"][c]),
                                      g(d["labour_available"]) * 0.1 / g(d["labour"][c])}));
      if (d.contains("max_area") && d["max_area"].contains(c)) a = std::min(a, g(d["max_area"][c]));
      if (a >= 1) d["min_area"][c] = a;
    }
  }
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "A farm cooperative has {land} {area}s to plant next season with {list}. Each crop has a "
          "yield, a selling price and a growing cost per {area}, and uses irrigation water and labour, "
          "which are limited.",
          "A grower is deciding how to split {land} {area}s of farmland among {list}. Water rights and "
          "the available seasonal labour limit what can be grown.",
          "An agricultural planner must choose the area of each crop ({list}) on {land} {area}s of land "
          "to maximise the season's net revenue."})),
      fmt::arg("land", num(land)), fmt::arg("area", area), fmt::arg("list", join_and(C)));
  std::string inl;
  for (auto& c : C)
    inl += fmt::format(
        "{} yields {} tons per {} sold at {} per ton, costs {} per {} to grow, and needs {} "
        "acre-inches of water and {} hours of labour per {}. ",
        c, num(g(d["yield"][c])), area, money(g(d["price"][c])), money(g(d["cost"][c])), area,
        num(g(d["water"][c])), num(g(d["labour"][c])), area);
  inl += fmt::format("The farm has {} acre-inches of water and {} labour hours for the season. ",
                     num(g(d["water_available"])), num(g(d["labour_available"])));
  std::string extra;
  if (d.contains("max_area"))
    for (auto& [c, v] : d["max_area"].items())
      extra += fmt::format("Rotation rules allow at most {} {}s of {}. ", num(g(v)), area, c);
  if (d.contains("min_area"))
    for (auto& [c, v] : d["min_area"].items())
      extra += fmt::format("A contract requires at least {} {}s of {}. ", num(g(v)), area, c);
  in.inline_data = inl + extra;
  Table t{"Per-" + area + " data:",
          {"Crop", "Yield (t)", "Price ($/t)", "Cost ($)", "Water (acre-in)", "Labour (h)"},
          {}};
  for (auto& c : C)
    t.rows.push_back({c, num(g(d["yield"][c])), num(g(d["price"][c])), num(g(d["cost"][c])),
                      num(g(d["water"][c])), num(g(d["labour"][c]))});
  in.tables = {t};
  in.table_lead = fmt::format("Land: {} {}s; water: {} acre-inches; labour: {} hours. ", num(land), area,
                              num(g(d["water_available"])), num(g(d["labour_available"]))) +
                  extra;
  in.question = fmt::format(
      "How many {}s of each crop should be planted to maximise net revenue (revenue minus "
      "growing cost)? Land may be left unplanted.",
      area);
  in.data_keys = {{"crops", "list of crops"},
                  {"land", "total area"},
                  {"yield", "tons per unit area"},
                  {"price", "selling price per ton"},
                  {"cost", "growing cost per unit area"},
                  {"water", "water per unit area"},
                  {"labour", "labour hours per unit area"},
                  {"water_available", "water available"},
                  {"labour_available", "labour hours available"},
                  {"max_area", "rotation limit per crop (key may be missing)"},
                  {"min_area", "contracted minimum per crop (key may be missing)"}};
  ModelBuilder mb("crop_planning", Sense::Maximize);
  std::map<std::string, int> x;
  for (auto& c : C) {
    const double lo = d.contains("min_area") && d["min_area"].contains(c) ? g(d["min_area"][c]) : 0.0;
    const double hi = d.contains("max_area") && d["max_area"].contains(c) ? g(d["max_area"][c]) : kInf;
    x[c] = mb.var("area_" + c, lo, hi);  // contracts and rotation limits as bounds (route 2 uses rows)
    mb.obj(x[c], g(d["yield"][c]) * g(d["price"][c]) - g(d["cost"][c]));
  }
  const int rl = mb.row("land", RowSense::LE, land),
            rw = mb.row("water", RowSense::LE, g(d["water_available"])),
            rb = mb.row("labour", RowSense::LE, g(d["labour_available"]));
  for (auto& c : C) {
    mb.add(rl, x[c], 1);
    mb.add(rw, x[c], g(d["water"][c]));
    mb.add(rb, x[c], g(d["labour"][c]));
  }
  in.model = mb.take();
  in.mathprog = R"(set crops;
param land; param yield{crops}; param price{crops}; param cost{crops}; param water{crops}; param labour{crops};
param water_available; param labour_available;
param max_area{crops} default -1; param min_area{crops} default 0;
var area{crops} >= 0;
maximize net_revenue: sum{c in crops} (yield[c] * price[c] - cost[c]) * area[c];
s.t. land_use: sum{c in crops} area[c] <= land;
s.t. water_use: sum{c in crops} water[c] * area[c] <= water_available;
s.t. labour_use: sum{c in crops} labour[c] * area[c] <= labour_available;
s.t. rotation{c in crops: max_area[c] >= 0}: area[c] <= max_area[c];
s.t. contract{c in crops}: area[c] >= min_area[c];
)";
  in.formulation = R"(Sets:
- C: crops.
Parameters:
- y_c yield, p_c price, k_c cost, w_c water, l_c labour per unit area; L land, W water, B labour available.
- u_c rotation limit, m_c contracted minimum (where given).
Decision variables:
- a_c >= 0: area planted with crop c (continuous).
Objective:
- maximize sum_c (y_c * p_c - k_c) * a_c
Constraints:
- land: sum_c a_c <= L; water: sum_c w_c a_c <= W; labour: sum_c l_c a_c <= B
- rotation: a_c <= u_c; contracts: a_c >= m_c)";
  in.python_body = R"(C = data["crops"]
model = gp.Model("crop_planning")
lo = {c: data.get("min_area", {}).get(c, 0) for c in C}
hi = {c: data.get("max_area", {}).get(c, GRB.INFINITY) for c in C}
a = model.addVars(C, lb=lo, ub=hi, name="area")
model.setObjective(gp.quicksum((data["yield"][c] * data["price"][c] - data["cost"][c]) * a[c] for c in C), GRB.MAXIMIZE)
model.addConstr(a.sum() <= data["land"], name="land")
model.addConstr(gp.quicksum(data["water"][c] * a[c] for c in C) <= data["water_available"], name="water")
model.addConstr(gp.quicksum(data["labour"][c] * a[c] for c in C) <= data["labour_available"], name="labour")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Crop planning LP with {} crops on {} {}s.", n, num(land), area),
      {"Continuous area per crop; the net revenue per unit area is yield x price - cost.",
       "Land, water and labour give three <= rows.", "Rotation limits and contracts are simple bounds."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance media_allocation(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> pool = {
      "TV_prime_time", "Radio",    "Newspaper", "Magazine",        "Social_media", "Search_ads",
      "Billboards",    "Podcasts", "Email",     "Streaming_video", "Cinema",       "Influencers"};
  static const std::vector<std::string> brands = {"a sportswear brand",           "a regional bank",
                                                  "a new streaming service",      "a city museum",
                                                  "an electric-scooter start-up", "a charity drive"};
  const int n = size_for(rng, req.difficulty, 2, 3, 3, 5, 5, 8, 8, 12);
  const bool integer = rng.chance(0.6);
  auto C = rng.sample(pool, n);
  Instance in;
  in.family = "media_allocation";
  in.problem_class = integer ? "MILP" : "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "thousand people reached";
  json& d = in.data;
  d["channels"] = C;
  double full = 0;
  for (auto& c : C) {
    d["cost"][c] = rng.integer(5, 200) * 100;
    d["reach"][c] = rng.integer(2, 400);
    d["max_ads"][c] = rng.integer(3, 30);
    full += g(d["cost"][c]) * g(d["max_ads"][c]);
  }
  const double budget = std::round(full * rng.real(0.2, 0.6, 0.01) / 1000) * 1000 + 1000;
  d["budget"] = budget;
  d["max_share"] = rng.real(0.3, 0.6, 0.05);
  if (req.target == Expected::Infeasible) {
    double total = 0;
    for (auto& c : C) {
      d["min_ads"][c] =
          std::min(g(d["max_ads"][c]), std::ceil(budget * rng.real(1.2, 1.5, 0.01) / n / g(d["cost"][c])));
      total += g(d["min_ads"][c]) * g(d["cost"][c]);
    }
    if (total <= budget) {  // small budgets next to the ad limits: make the commitments exceed it anyway
      d["budget"] = std::floor(total * 0.8);
    }
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("the minimum ad commitments alone cost {} but the budget is {}",
                                   money(total), money(g(d["budget"])));
  } else if (rng.chance(0.5)) {
    const std::string& c = C[rng.integer(0, n - 1)];
    const double cap = std::floor(std::min(g(d["max_share"]) * budget, budget) / g(d["cost"][c]));
    if (cap >= 1) d["min_ads"][c] = std::min<double>(rng.integer(1, 3), std::min(cap, g(d["max_ads"][c])));
  }
  const std::string brand = rng.pick(brands);
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "The marketing team of {brand} is planning a campaign across {list}. Each ad placement "
          "has a cost and an expected audience reach, and each channel sells a limited number of "
          "slots.",
          "{brand_cap} wants to maximise the total audience exposure of its next campaign. It can "
          "buy ads on {list}, within a fixed budget."})),
      fmt::arg("brand", brand), fmt::arg("brand_cap", capitalize(brand)), fmt::arg("list", join_and(C)));
  std::string inl;
  for (auto& c : C)
    inl += fmt::format("An ad on {} costs {}, reaches {} thousand people, and at most {} can be bought. ", c,
                       money(g(d["cost"][c])), num(g(d["reach"][c])), num(g(d["max_ads"][c])));
  std::string rules = fmt::format("The budget is {}, and no single channel may take more than {}% of it. ",
                                  money(g(d["budget"])), num(g(d["max_share"]) * 100));
  if (d.contains("min_ads"))
    for (auto& [c, v] : d["min_ads"].items())
      rules += fmt::format("At least {} ads must run on {}. ", num(g(v)), c);
  in.inline_data = inl + rules;
  Table t{"Channels:", {"Channel", "Cost per ad ($)", "Reach per ad (thousand)", "Max ads"}, {}};
  for (auto& c : C)
    t.rows.push_back({c, num(g(d["cost"][c])), num(g(d["reach"][c])), num(g(d["max_ads"][c]))});
  in.tables = {t};
  in.table_lead = rules;
  in.question =
      integer ? "Ads are bought whole. How many ads should be placed on each channel to maximise total reach?"
              : "Treat the number of ads as continuous (airtime can be split). What allocation maximises "
                "total reach?";
  in.data_keys = {{"channels", "list of channels"},
                  {"cost", "cost per ad"},
                  {"reach", "audience per ad (thousands)"},
                  {"max_ads", "ads available per channel"},
                  {"budget", "total budget"},
                  {"max_share", "largest fraction of the budget one channel may use"},
                  {"min_ads", "committed minimum ads per channel (key may be missing)"}};
  ModelBuilder mb("media_allocation", Sense::Maximize);
  std::map<std::string, int> x;
  for (auto& c : C) {
    x[c] = mb.var("ads_" + c, 0, g(d["max_ads"][c]), integer ? VarType::Integer : VarType::Continuous);
    mb.obj(x[c], g(d["reach"][c]));
  }
  const int rb = mb.row("budget", RowSense::LE, g(d["budget"]));
  for (auto& c : C) {
    mb.add(rb, x[c], g(d["cost"][c]));
    const int rs = mb.row("share_" + c, RowSense::LE, g(d["max_share"]) * g(d["budget"]));
    mb.add(rs, x[c], g(d["cost"][c]));
  }
  if (d.contains("min_ads"))
    for (auto& [c, v] : d["min_ads"].items()) mb.add(mb.row("commit_" + c, RowSense::GE, g(v)), x[c], 1);
  in.model = mb.take();
  in.mathprog = std::string(R"(set channels;
param cost{channels}; param reach{channels}; param max_ads{channels};
param budget; param max_share; param min_ads{channels} default 0;
var ads{c in channels} >= min_ads[c], <= max_ads[c])") +
                (integer ? ", integer" : "") + R"(;
maximize total_reach: sum{c in channels} reach[c] * ads[c];
s.t. spend: sum{c in channels} cost[c] * ads[c] <= budget;
s.t. share{c in channels}: cost[c] * ads[c] <= max_share * budget;
)";
  in.formulation = fmt::format(R"(Sets:
- C: channels.
Parameters:
- c_k cost per ad, r_k reach per ad, u_k ads available, m_k committed minimum (0 if none); B budget; s max share.
Decision variables:
- x_k: ads on channel k, m_k <= x_k <= u_k, {}.
Objective:
- maximize sum_k r_k * x_k
Constraints:
- budget: sum_k c_k * x_k <= B
- diversification: c_k * x_k <= s * B for every channel k)",
                               integer ? "integer" : "continuous");
  in.python_body = fmt::format(R"(C = data["channels"]
B = data["budget"]
model = gp.Model("media_allocation")
x = model.addVars(C, lb={{c: data.get("min_ads", {{}}).get(c, 0) for c in C}}, ub={{c: data["max_ads"][c] for c in C}},
                  vtype={}, name="ads")
model.setObjective(gp.quicksum(data["reach"][c] * x[c] for c in C), GRB.MAXIMIZE)
model.addConstr(gp.quicksum(data["cost"][c] * x[c] for c in C) <= B, name="budget")
for c in C:
    model.addConstr(data["cost"][c] * x[c] <= data["max_share"] * B, name=f"share_{{c}}")
model.optimize()
)",
                               integer ? "GRB.INTEGER" : "GRB.CONTINUOUS");
  in.reasoning =
      bullet_reasoning(fmt::format("Media allocation over {} channels: maximise reach within a budget.", n),
                       {fmt::format("x_k = ads on channel k, {}, bounded by availability and commitments.",
                                    integer ? "integer" : "continuous"),
                        "One budget row; one diversification row per channel (spend on k at most the share "
                        "times the budget)."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance capacity_planning(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> quarters = {"Q1", "Q2", "Q3", "Q4"};
  const int T = size_for(rng, req.difficulty, 3, 4, 4, 6, 6, 8, 8, 12);
  struct Theme {
    std::string firm, unit, module;
  };
  static const std::vector<Theme> themes = {{"a data-centre operator", "server-hours", "server rack"},
                                            {"a bottling company", "thousand bottles", "filling line"},
                                            {"a hospital network", "patient-days", "ward module"},
                                            {"a parcel hub", "thousand parcels", "sorting module"}};
  const Theme& th = rng.pick(themes);
  std::vector<std::string> P;
  for (int t = 0; t < T; ++t) P.push_back(fmt::format("Y{}{}", t / 4 + 1, quarters[t % 4]));
  Instance in;
  in.family = "capacity_planning";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "thousand dollars";
  json& d = in.data;
  d["periods"] = P;
  const double c0 = rng.integer(10, 40) * 10;
  d["initial_capacity"] = c0;
  d["module_size"] = rng.integer(2, 10) * 10;
  double dem = c0 * rng.real(0.7, 1.0, 0.01);
  for (int t = 0; t < T; ++t) {
    d["demand"][P[t]] = std::round(dem);
    dem *= rng.real(1.02, 1.15, 0.01);
    d["module_cost"][P[t]] = rng.integer(20, 120);
    d["rank"][P[t]] = t + 1;
  }
  d["production_cost"] = rng.real(0.1, 0.5, 0.05);
  d["outsource_cost"] = rng.real(0.8, 2.0, 0.05);
  d["max_outsource"] = std::round(c0 * rng.real(0.1, 0.3, 0.01));
  double peak = g(d["demand"][P[T - 1]]);
  const double need_modules =
      std::ceil(std::max(0.0, peak - c0 - g(d["max_outsource"])) / g(d["module_size"]));
  if (req.target == Expected::Infeasible) {
    // The module limit leaves the last quarter short: its demand exceeds everything that can be made.
    const double limit = std::max(0.0, need_modules - 1 - rng.integer(0, 1));
    d["max_modules"] = limit;
    const double most = c0 + limit * g(d["module_size"]) + g(d["max_outsource"]);
    if (peak <= most) d["demand"][P[T - 1]] = peak = most + rng.integer(5, 40);
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format(
        "in {} demand is {} but even {} modules give capacity {} plus at most {} outsourced", P[T - 1],
        num(peak), num(limit), num(c0 + limit * g(d["module_size"])), num(g(d["max_outsource"])));
  } else {
    d["max_modules"] = need_modules + rng.integer(1, 4);
  }
  in.story = fmt::format(
      "{} serves a growing demand measured in {}. Its current capacity can be expanded at the start of any "
      "quarter by installing {}s, each adding a fixed amount of capacity for all later quarters. Demand that "
      "capacity cannot cover can be outsourced, up to a limit per quarter, at a higher unit cost.",
      capitalize(th.firm), th.unit, th.module);
  std::string inl = fmt::format(
      "Current capacity is {} {} per quarter; each {} adds {}. At most {} {}s can be installed over the "
      "horizon. "
      "In-house production costs {} thousand dollars per unit and outsourcing {} thousand dollars per unit, "
      "up to "
      "{} units per quarter. ",
      num(c0), th.unit, th.module, num(g(d["module_size"])), num(g(d["max_modules"])), th.module,
      num(g(d["production_cost"])), num(g(d["outsource_cost"])), num(g(d["max_outsource"])));
  for (auto& p : P)
    inl += fmt::format("{}: demand {}, module cost {} thousand dollars. ", p, num(g(d["demand"][p])),
                       num(g(d["module_cost"][p])));
  in.inline_data = inl;
  Table t{"Quarterly data:", {"Quarter", "Demand (" + th.unit + ")", "Module cost (k$)"}, {}};
  for (auto& p : P) t.rows.push_back({p, num(g(d["demand"][p])), num(g(d["module_cost"][p]))});
  in.tables = {t};
  in.table_lead = fmt::format(
      "Initial capacity {}; module size {}; at most {} modules in total; production cost {} k$/unit; "
      "outsourcing "
      "{} k$/unit, at most {} per quarter.",
      num(c0), num(g(d["module_size"])), num(g(d["max_modules"])), num(g(d["production_cost"])),
      num(g(d["outsource_cost"])), num(g(d["max_outsource"])));
  in.question =
      "When should modules be installed, and how much should be outsourced each quarter, to meet demand "
      "at minimum total cost?";
  in.data_keys = {{"periods", "quarters in time order"},
                  {"rank", "position of each quarter (1, 2, ...)"},
                  {"demand", "demand per quarter"},
                  {"initial_capacity", "capacity before any expansion"},
                  {"module_size", "capacity added by one module"},
                  {"module_cost", "cost of a module by quarter"},
                  {"max_modules", "most modules over the horizon"},
                  {"production_cost", "in-house cost per unit"},
                  {"outsource_cost", "outsourcing cost per unit"},
                  {"max_outsource", "outsourcing limit per quarter"}};
  ModelBuilder mb("capacity_planning", Sense::Minimize);
  std::vector<int> y, x, o;
  for (auto& p : P) {
    y.push_back(mb.integer("modules_" + p));
    x.push_back(mb.var("make_" + p));
    o.push_back(mb.var("outsource_" + p, 0, g(d["max_outsource"])));
    mb.obj(y.back(), g(d["module_cost"][p]));
    mb.obj(x.back(), g(d["production_cost"]));
    mb.obj(o.back(), g(d["outsource_cost"]));
  }
  for (int k = 0; k < T; ++k) {
    const int rc = mb.row("capacity_" + P[k], RowSense::LE, c0);  // x_t - size * sum_{u<=t} y_u <= C0
    mb.add(rc, x[k], 1);
    for (int u = 0; u <= k; ++u) mb.add(rc, y[u], -g(d["module_size"]));
    const int rd = mb.row("demand_" + P[k], RowSense::GE, g(d["demand"][P[k]]));
    mb.add(rd, x[k], 1);
    mb.add(rd, o[k], 1);
  }
  const int rm = mb.row("module_limit", RowSense::LE, g(d["max_modules"]));
  for (int v : y) mb.add(rm, v, 1);
  in.model = mb.take();
  in.mathprog = R"(set periods;
param rank{periods}; param demand{periods}; param initial_capacity; param module_size;
param module_cost{periods}; param max_modules; param production_cost; param outsource_cost; param max_outsource;
var modules{periods} >= 0, integer;
var make{periods} >= 0;
var outsource{periods} >= 0, <= max_outsource;
minimize total_cost: sum{t in periods} (module_cost[t] * modules[t] + production_cost * make[t]
  + outsource_cost * outsource[t]);
s.t. capacity{t in periods}: make[t] <= initial_capacity + module_size * sum{u in periods: rank[u] <= rank[t]} modules[u];
s.t. meet{t in periods}: make[t] + outsource[t] >= demand[t];
s.t. limit: sum{t in periods} modules[t] <= max_modules;
)";
  in.formulation = R"(Sets:
- T: quarters in order.
Parameters:
- d_t demand; C0 initial capacity; s module size; f_t module cost; K module limit; c production cost;
  o outsourcing cost; U outsourcing limit.
Decision variables:
- y_t >= 0 integer: modules installed at the start of t; x_t >= 0 in-house output; z_t in [0, U] outsourced.
Objective:
- minimize sum_t (f_t y_t + c x_t + o z_t)
Constraints:
- capacity: x_t <= C0 + s * sum_(u <= t) y_u
- demand: x_t + z_t >= d_t
- module limit: sum_t y_t <= K)";
  in.python_body = R"(T = data["periods"]
s = data["module_size"]
model = gp.Model("capacity_planning")
y = model.addVars(T, lb=0, ub=GRB.INFINITY, vtype=GRB.INTEGER, name="modules")
x = model.addVars(T, lb=0, ub=GRB.INFINITY, name="make")
z = model.addVars(T, lb=0, ub=data["max_outsource"], name="outsource")
model.setObjective(gp.quicksum(data["module_cost"][t] * y[t] + data["production_cost"] * x[t]
                               + data["outsource_cost"] * z[t] for t in T), GRB.MINIMIZE)
for k, t in enumerate(T):
    model.addConstr(x[t] <= data["initial_capacity"] + s * gp.quicksum(y[u] for u in T[:k + 1]), name=f"capacity_{t}")
    model.addConstr(x[t] + z[t] >= data["demand"][t], name=f"demand_{t}")
model.addConstr(y.sum() <= data["max_modules"], name="module_limit")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Capacity expansion over {} quarters with integer modules and limited outsourcing.", T),
      {"Integer y_t (modules), continuous production x_t and outsourcing z_t.",
       "Capacity in t is the initial capacity plus all modules installed up to t.",
       "Demand rows x_t + z_t >= d_t; a total module limit."});
  return in;
}

}  // namespace

void add_planning_families(std::vector<Family>& out) {
  out.push_back({"crop_planning", "production_planning", true, false, &crop_planning});
  out.push_back({"media_allocation", "portfolio_budget", true, false, &media_allocation});
  out.push_back({"capacity_planning", "capacity_planning", true, false, &capacity_planning});
}

}  // namespace trex::orkit::gen
