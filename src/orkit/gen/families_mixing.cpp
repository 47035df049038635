// Mixing families: diet (cheapest menu meeting nutrient bounds) and blending (cheapest blend of raw
// materials meeting quality specifications). Feasible instances are feasible by construction: the
// bounds are drawn around a reference plan that the generator knows satisfies them.
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
struct Nutrient {
  std::string name, unit;
  double lo, hi, step;  // content per serving
};

Instance diet(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> foods_pool = {"Oatmeal", "Chicken",  "Eggs",    "Milk",    "Rice",
                                                      "Beans",   "Broccoli", "Apples",  "Bread",   "Cheese",
                                                      "Tofu",    "Salmon",   "Lentils", "Spinach", "Yogurt",
                                                      "Peanuts", "Potatoes", "Carrots", "Pasta",   "Bananas"};
  static const std::vector<Nutrient> nutr_pool = {
      {"protein", "g", 0, 30, 1},   {"fat", "g", 0, 20, 1},       {"carbohydrates", "g", 0, 60, 1},
      {"fibre", "g", 0, 10, 0.5},   {"calcium", "mg", 0, 300, 5}, {"iron", "mg", 0, 5, 0.1},
      {"vitamin C", "mg", 0, 60, 1}};
  struct Ctx {
    std::string who, eater, period;
  };
  static const std::vector<Ctx> ctxs = {{"a hospital dietitian", "a patient", "day"},
                                        {"a school canteen", "each pupil", "lunch"},
                                        {"an expedition planner", "each hiker", "day"},
                                        {"a care-home kitchen", "each resident", "day"},
                                        {"a sports nutritionist", "an athlete", "day"}};
  const Ctx& cx = rng.pick(ctxs);
  const int n = size_for(rng, req.difficulty, 3, 4, 5, 7, 8, 12, 13, 20);
  const int m = size_for(rng, req.difficulty, 1, 2, 2, 3, 3, 5, 4, 6);
  const bool integer = rng.chance(0.35);
  auto F = rng.sample(foods_pool, n);
  std::vector<Nutrient> nutrs = rng.sample(nutr_pool, m);
  nutrs.insert(nutrs.begin(), Nutrient{"calories", "kcal", 50, 400, 5});  // every food has calories
  std::vector<std::string> N;
  for (auto& x : nutrs) N.push_back(x.name);

  Instance in;
  in.family = "diet";
  in.problem_class = integer ? "MILP" : "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["foods"] = F;
  d["nutrients"] = N;
  for (auto& f : F) d["cost"][f] = rng.real(0.2, 3.0, 0.05);
  for (size_t k = 0; k < nutrs.size(); ++k)
    for (auto& f : F)
      d["content"][N[k]][f] = (k > 0 && rng.chance(0.3)) ? 0.0
                                                         : rng.real(std::max(nutrs[k].lo, nutrs[k].step),
                                                                    nutrs[k].hi, nutrs[k].step);
  std::map<std::string, double> reference,
      most;  // nutrient totals of a reference menu / of the maximum servings
  for (auto& f : F) {
    d["max_servings"][f] = rng.integer(2, 6);
    const int ref = rng.integer(1, d["max_servings"][f].get<int>());
    for (auto& nn : N) {
      reference[nn] += g(d["content"][nn][f]) * ref;
      most[nn] += g(d["content"][nn][f]) * g(d["max_servings"][f]);
    }
  }
  for (size_t k = 0; k < N.size(); ++k) {
    const double step = nutrs[k].step;
    d["min_intake"][N[k]] = std::floor(reference[N[k]] * rng.real(0.5, 0.9, 0.01) / step) * step;
    if (k > 0 && rng.chance(0.4))
      d["max_intake"][N[k]] = std::ceil(reference[N[k]] * rng.real(1.1, 1.4, 0.01) / step) * step;
  }
  if (req.target == Expected::Infeasible) {
    size_t k = 0;  // calories always have a positive total
    if (rng.chance(0.5))
      for (size_t j = 1; j < N.size(); ++j)
        if (most[N[j]] > 0) k = j;
    const double need = std::ceil(most[N[k]] * rng.real(1.1, 1.3, 0.01) / nutrs[k].step) * nutrs[k].step;
    d["min_intake"][N[k]] = need;
    if (d.contains("max_intake")) d["max_intake"].erase(N[k]);
    if (d.contains("max_intake") && d["max_intake"].empty()) d.erase("max_intake");
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format(
        "even the maximum servings of every food supply only {} {} of {}, below the "
        "required {}",
        num(most[N[k]]), nutrs[k].unit, N[k], num(need));
  }
  auto unit_of = [&](const std::string& nn) {
    for (auto& x : nutrs)
      if (x.name == nn) return x.unit;
    return std::string();
  };
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "{who_cap} plans the menu of {eater} for one {period} from {n} foods ({list}). The menu "
          "must meet nutritional targets for {nut} at the lowest food cost.",
          "To keep costs down, {who} wants the cheapest combination of {list} that still gives "
          "{eater} enough {nut} per {period}.",
          "{who_cap} must choose how many servings of each available food ({list}) to serve {eater} "
          "in a {period}. Nutritional guidelines cover {nut}."})),
      fmt::arg("who_cap", capitalize(cx.who)), fmt::arg("who", cx.who), fmt::arg("eater", cx.eater),
      fmt::arg("period", cx.period), fmt::arg("n", n), fmt::arg("list", join_and(F)),
      fmt::arg("nut", join_and(N)));
  std::string inl;
  for (auto& f : F) {
    std::vector<std::string> parts;
    for (auto& nn : N)
      if (g(d["content"][nn][f]) > 0)
        parts.push_back(fmt::format("{} {} of {}", num(g(d["content"][nn][f])), unit_of(nn), nn));
    inl += fmt::format("A serving of {} costs {} and provides {}; at most {} servings can be served. ", f,
                       money(g(d["cost"][f])), join_and(parts), num(g(d["max_servings"][f])));
  }
  std::vector<std::string> mins, maxs;
  for (auto& nn : N) mins.push_back(fmt::format("{} {} of {}", num(g(d["min_intake"][nn])), unit_of(nn), nn));
  if (d.contains("max_intake"))
    for (auto& [nn, v] : d["max_intake"].items())
      maxs.push_back(fmt::format("{} {} of {}", num(g(v)), unit_of(nn), nn));
  std::string limits = fmt::format("The menu must provide at least {}.", join_and(mins));
  if (!maxs.empty()) limits += fmt::format(" It may provide at most {}.", join_and(maxs));
  in.inline_data = inl + limits;
  Table t1{"Nutrients per serving, cost and serving limit:", {"Food", "Cost ($)"}, {}};
  for (auto& nn : N) t1.header.push_back(capitalize(nn) + " (" + unit_of(nn) + ")");
  t1.header.push_back("Max servings");
  for (auto& f : F) {
    std::vector<std::string> row{f, num(g(d["cost"][f]))};
    for (auto& nn : N) row.push_back(num(g(d["content"][nn][f])));
    row.push_back(num(g(d["max_servings"][f])));
    t1.rows.push_back(row);
  }
  Table t2{"Daily requirements:", {"Nutrient", "Minimum", "Maximum"}, {}};
  for (auto& nn : N)
    t2.rows.push_back({nn, num(g(d["min_intake"][nn])) + " " + unit_of(nn),
                       d.contains("max_intake") && d["max_intake"].contains(nn)
                           ? num(g(d["max_intake"][nn])) + " " + unit_of(nn)
                           : "-"});
  in.tables = {t1, t2};
  in.question =
      integer ? "Only whole servings can be served. Which menu minimises the total cost?"
              : "Servings may be fractional (portions can be scaled). Which menu minimises the total cost?";
  in.data_keys = {
      {"foods", "list of foods"},
      {"nutrients", "list of nutrients"},
      {"cost", "cost per serving, keyed by food"},
      {"content", "content[nutrient][food]: amount of the nutrient in one serving"},
      {"max_servings", "largest number of servings of each food"},
      {"min_intake", "minimum total amount of each nutrient"},
      {"max_intake", "maximum total amount, only for the nutrients that have one (key may be missing)"}};

  ModelBuilder mb("diet", Sense::Minimize);
  std::map<std::string, int> x;
  for (auto& f : F) {
    x[f] = mb.var("serve_" + f, 0, g(d["max_servings"][f]), integer ? VarType::Integer : VarType::Continuous);
    mb.obj(x[f], g(d["cost"][f]));
  }
  for (auto& nn : N) {
    const int r = mb.row("min_" + nn, RowSense::GE, g(d["min_intake"][nn]));
    for (auto& f : F) mb.add(r, x[f], g(d["content"][nn][f]));
  }
  if (d.contains("max_intake"))
    for (auto& [nn, v] : d["max_intake"].items()) {
      const int r = mb.row("max_" + nn, RowSense::LE, g(v));
      for (auto& f : F) mb.add(r, x[f], g(d["content"][nn][f]));
    }
  in.model = mb.take();
  in.mathprog = std::string(R"(set foods; set nutrients;
param cost{foods}; param content{nutrients, foods} default 0; param max_servings{foods};
param min_intake{nutrients}; param max_intake{nutrients} default -1;
var serve{f in foods} >= 0, <= max_servings[f])") +
                (integer ? ", integer" : "") + R"(;
minimize total_cost: sum{f in foods} cost[f] * serve[f];
s.t. enough{k in nutrients}: sum{f in foods} content[k,f] * serve[f] >= min_intake[k];
s.t. not_too_much{k in nutrients: max_intake[k] >= 0}: sum{f in foods} content[k,f] * serve[f] <= max_intake[k];
)";
  in.formulation = fmt::format(R"(Sets:
- F: foods; N: nutrients.
Parameters:
- c_f: cost per serving; a_(n,f): amount of nutrient n in a serving of f; U_f: serving limit of f.
- l_n: minimum of nutrient n; h_n: maximum of nutrient n (only where given).
Decision variables:
- x_f: servings of food f, 0 <= x_f <= U_f, {}.
Objective:
- minimize sum_(f in F) c_f * x_f
Constraints:
- minimum nutrients: sum_(f in F) a_(n,f) * x_f >= l_n for every n in N
- maximum nutrients: sum_(f in F) a_(n,f) * x_f <= h_n for every n with a maximum)",
                               integer ? "integer" : "continuous");
  in.python_body = fmt::format(R"(F = data["foods"]
N = data["nutrients"]
model = gp.Model("diet")
x = model.addVars(F, lb=0, ub={{f: data["max_servings"][f] for f in F}}, vtype={}, name="serve")
model.setObjective(gp.quicksum(data["cost"][f] * x[f] for f in F), GRB.MINIMIZE)
for k in N:
    model.addConstr(gp.quicksum(data["content"][k][f] * x[f] for f in F) >= data["min_intake"][k], name=f"min_{{k}}")
for k, high in data.get("max_intake", {{}}).items():
    model.addConstr(gp.quicksum(data["content"][k][f] * x[f] for f in F) <= high, name=f"max_{{k}}")
model.optimize()
)",
                               integer ? "GRB.INTEGER" : "GRB.CONTINUOUS");
  in.reasoning =
      bullet_reasoning(fmt::format("A diet problem: {} foods, {} nutrients, minimise cost.", n, N.size()),
                       {fmt::format("x_f = servings of food f, {} and bounded by the serving limit.",
                                    integer ? "integer" : "continuous"),
                        "Objective: total cost sum c_f x_f.", "One >= row per nutrient minimum.",
                        maxs.empty() ? "No nutrient has a maximum."
                                     : fmt::format("{} nutrients also have a <= row.", maxs.size())});
  return in;
}

// ------------------------------------------------------------------------------------------------
struct BlendTheme {
  std::string firm, product, unit, material_word;
  std::vector<std::string> materials;
  std::vector<std::pair<std::string, std::string>> attributes;  // name, unit
  double q_lo, q_hi;
};

Instance blending(Rng& rng, const GenRequest& req) {
  static const std::vector<BlendTheme> themes = {
      {"a refinery",
       "gasoline",
       "barrels",
       "component",
       {"Alkylate", "Reformate", "Butane", "Naphtha", "FCC_gasoline", "Isomerate", "Ethanol", "Raffinate"},
       {{"octane", "RON"}, {"sulfur", "ppm"}, {"vapour pressure", "psi"}},
       5,
       100},
      {"a feed mill",
       "cattle feed",
       "tons",
       "ingredient",
       {"Corn", "Soymeal", "Wheat", "Barley", "Fishmeal", "Oats", "Sorghum", "Canola_meal"},
       {{"protein", "%"}, {"fat", "%"}, {"fibre", "%"}},
       1,
       45},
      {"a steel foundry",
       "cast iron",
       "tons",
       "charge material",
       {"Pig_iron", "Steel_scrap", "Cast_scrap", "Ferrosilicon", "Returns", "Briquettes", "Turnings"},
       {{"carbon", "%"}, {"silicon", "%"}, {"manganese", "%"}},
       0.1,
       5},
      {"a paint maker",
       "primer",
       "litres",
       "base",
       {"Resin_A", "Resin_B", "Solvent", "Pigment_paste", "Filler", "Binder", "Thinner"},
       {{"solids", "%"}, {"viscosity", "cP"}, {"VOC", "g/L"}},
       5,
       90}};
  const BlendTheme& th = rng.pick(themes);
  const int n = std::min<int>(th.materials.size(), size_for(rng, req.difficulty, 3, 3, 4, 5, 5, 7, 6, 8));
  const int na = std::min<int>(th.attributes.size(), size_for(rng, req.difficulty, 1, 2, 2, 3, 2, 3, 3, 3));
  auto M = rng.sample(th.materials, n);
  auto attrs = rng.sample(th.attributes, na);
  std::vector<std::string> A;
  for (auto& a : attrs) A.push_back(a.first);
  Instance in;
  in.family = "blending";
  in.problem_class = "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["materials"] = M;
  d["attributes"] = A;
  const double demand = rng.integer(10, 200) * 10;
  d["demand"] = demand;
  std::vector<double> w(n);
  double wsum = 0;
  for (auto& x : w) wsum += (x = rng.real(0.1, 1.0, 0.01));
  for (int k = 0; k < n; ++k) {
    d["cost"][M[k]] = rng.real(20, 120, 0.5);
    d["availability"][M[k]] = std::ceil(demand * w[k] / wsum * rng.real(1.2, 3.0, 0.01));
  }
  for (auto& a : A)
    for (auto& mm : M) d["quality"][a][mm] = rng.real(th.q_lo, th.q_hi, 0.1);
  for (auto& a : A) {
    double v = 0;  // quality of the reference blend
    for (int k = 0; k < n; ++k) v += g(d["quality"][a][M[k]]) * w[k] / wsum;
    const int kind = rng.integer(0, 2);  // 0: minimum, 1: maximum, 2: both
    if (kind != 1) d["min_quality"][a] = std::floor(v * rng.real(0.9, 0.99, 0.01) * 10) / 10;
    if (kind != 0) d["max_quality"][a] = std::ceil(v * rng.real(1.01, 1.1, 0.01) * 10) / 10;
  }
  if (req.target == Expected::Infeasible) {
    const std::string& a = A[0];
    double best = 0;
    for (auto& mm : M) best = std::max(best, g(d["quality"][a][mm]));
    const double need = std::ceil(best * 10 + rng.integer(1, 20)) / 10;
    d["min_quality"][a] = need;
    if (d.contains("max_quality") && d["max_quality"].contains(a)) d["max_quality"][a] = need + 5;
    in.expected = Expected::Infeasible;
    in.status_reason =
        fmt::format("no {} has a {} above {}, so no blend can reach the required minimum of {}",
                    th.material_word, a, num(best), num(need));
  }
  auto unit_of = [&](const std::string& a) {
    for (auto& x : attrs)
      if (x.first == a) return x.second;
    return std::string();
  };
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "{firm_cap} must produce {dem} {unit} of {product} by blending {n} {mw}s ({list}). "
          "The blend's {attrs} are the volume-weighted averages of those of its {mw}s and must "
          "stay within specification.",
          "The blending desk of {firm} needs {dem} {unit} of {product}. Available {mw}s are "
          "{list}; each has a cost, a limited stock and known {attrs}, which mix linearly."})),
      fmt::arg("firm_cap", capitalize(th.firm)), fmt::arg("firm", th.firm), fmt::arg("dem", num(demand)),
      fmt::arg("unit", th.unit), fmt::arg("product", th.product), fmt::arg("n", n),
      fmt::arg("mw", th.material_word), fmt::arg("list", join_and(M)), fmt::arg("attrs", join_and(A)));
  std::string inl;
  for (auto& mm : M) {
    std::vector<std::string> q;
    for (auto& a : A) q.push_back(fmt::format("{} {} {}", a, num(g(d["quality"][a][mm])), unit_of(a)));
    inl += fmt::format("{} costs {} per {}, {} {} are in stock, and it has {}. ", mm, money(g(d["cost"][mm])),
                       th.unit.substr(0, th.unit.size() - 1), num(g(d["availability"][mm])), th.unit,
                       join_and(q));
  }
  std::vector<std::string> spec;
  for (auto& a : A) {
    const bool lo = d.contains("min_quality") && d["min_quality"].contains(a);
    const bool hi = d.contains("max_quality") && d["max_quality"].contains(a);
    if (lo && hi)
      spec.push_back(fmt::format("its {} between {} and {} {}", a, num(g(d["min_quality"][a])),
                                 num(g(d["max_quality"][a])), unit_of(a)));
    else if (lo)
      spec.push_back(fmt::format("its {} at least {} {}", a, num(g(d["min_quality"][a])), unit_of(a)));
    else if (hi)
      spec.push_back(fmt::format("its {} at most {} {}", a, num(g(d["max_quality"][a])), unit_of(a)));
  }
  inl += fmt::format("The {} must have {}.", th.product, join_and(spec));
  in.inline_data = inl;
  Table t1{"Materials:",
           {capitalize(th.material_word), "Cost ($/" + th.unit.substr(0, th.unit.size() - 1) + ")",
            "Stock (" + th.unit + ")"},
           {}};
  for (auto& a : A) t1.header.push_back(capitalize(a) + " (" + unit_of(a) + ")");
  for (auto& mm : M) {
    std::vector<std::string> row{mm, num(g(d["cost"][mm])), num(g(d["availability"][mm]))};
    for (auto& a : A) row.push_back(num(g(d["quality"][a][mm])));
    t1.rows.push_back(row);
  }
  Table t2{"Specification of the " + th.product + ":", {"Attribute", "Minimum", "Maximum"}, {}};
  for (auto& a : A)
    t2.rows.push_back(
        {a, d.contains("min_quality") && d["min_quality"].contains(a) ? num(g(d["min_quality"][a])) : "-",
         d.contains("max_quality") && d["max_quality"].contains(a) ? num(g(d["max_quality"][a])) : "-"});
  in.tables = {t1, t2};
  in.table_lead = fmt::format("Exactly {} {} of {} are needed.", num(demand), th.unit, th.product);
  in.question =
      fmt::format("How much of each {} should go into the blend to meet the specification at minimum cost?",
                  th.material_word);
  in.data_keys = {
      {"materials", "list of raw materials"},
      {"attributes", "list of quality attributes"},
      {"demand", "amount of blend to produce"},
      {"cost", "cost per unit, keyed by material"},
      {"availability", "stock of each material"},
      {"quality", "quality[attribute][material]"},
      {"min_quality", "minimum blend quality, for the attributes that have one (key may be missing)"},
      {"max_quality", "maximum blend quality, for the attributes that have one (key may be missing)"}};
  // Route 1: quality rows in the "excess over the bound" form sum (q - bound) x >= 0.
  ModelBuilder mb("blending", Sense::Minimize);
  std::map<std::string, int> x;
  for (auto& mm : M) {
    x[mm] = mb.var("use_" + mm, 0, g(d["availability"][mm]));
    mb.obj(x[mm], g(d["cost"][mm]));
  }
  const int rd = mb.row("demand", RowSense::EQ, demand);
  for (auto& mm : M) mb.add(rd, x[mm], 1);
  if (d.contains("min_quality"))
    for (auto& [a, b] : d["min_quality"].items()) {
      const int r = mb.row("min_" + a, RowSense::GE, 0);
      for (auto& mm : M) mb.add(r, x[mm], g(d["quality"][a][mm]) - g(b));
    }
  if (d.contains("max_quality"))
    for (auto& [a, b] : d["max_quality"].items()) {
      const int r = mb.row("max_" + a, RowSense::LE, 0);
      for (auto& mm : M) mb.add(r, x[mm], g(d["quality"][a][mm]) - g(b));
    }
  in.model = mb.take();
  in.mathprog = R"(set materials; set attributes;
param demand; param cost{materials}; param availability{materials};
param quality{attributes, materials};
param min_quality{attributes} default -1e9; param max_quality{attributes} default 1e9;
var use{m in materials} >= 0, <= availability[m];
minimize total_cost: sum{m in materials} cost[m] * use[m];
s.t. make: sum{m in materials} use[m] = demand;
s.t. low{a in attributes: min_quality[a] > -1e9}: sum{m in materials} quality[a,m] * use[m] >= min_quality[a] * demand;
s.t. high{a in attributes: max_quality[a] < 1e9}: sum{m in materials} quality[a,m] * use[m] <= max_quality[a] * demand;
)";
  in.formulation = R"(Sets:
- M: raw materials; A: quality attributes.
Parameters:
- D: amount to blend; c_m: unit cost; s_m: stock; q_(a,m): attribute a of material m; L_a / H_a: bounds on the blend.
Decision variables:
- x_m: amount of material m in the blend, 0 <= x_m <= s_m, continuous.
Objective:
- minimize sum_m c_m * x_m
Constraints:
- quantity: sum_m x_m = D
- quality (linear, since the blend quality is sum_m q_(a,m) x_m / D): sum_m q_(a,m) * x_m >= L_a * D and
  sum_m q_(a,m) * x_m <= H_a * D for the attributes with those bounds)";
  in.python_body = R"(M = data["materials"]
D = data["demand"]
model = gp.Model("blending")
x = model.addVars(M, lb=0, ub={m: data["availability"][m] for m in M}, name="use")
model.setObjective(gp.quicksum(data["cost"][m] * x[m] for m in M), GRB.MINIMIZE)
model.addConstr(x.sum() == D, name="demand")
for a, low in data.get("min_quality", {}).items():
    model.addConstr(gp.quicksum(data["quality"][a][m] * x[m] for m in M) >= low * D, name=f"min_{a}")
for a, high in data.get("max_quality", {}).items():
    model.addConstr(gp.quicksum(data["quality"][a][m] * x[m] for m in M) <= high * D, name=f"max_{a}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("A blending LP: {} materials, {} quality attributes, a fixed output of {} {}.", n, na,
                  num(demand), th.unit),
      {"Continuous x_m bounded by stock.", "Minimise material cost.",
       "Average quality sum q x / D is linearised by multiplying the bound by D (D is a constant).",
       "One equality fixes the total amount."});
  return in;
}

}  // namespace

void add_mixing_families(std::vector<Family>& out) {
  out.push_back({"diet", "blending_mixing", true, false, &diet});
  out.push_back({"blending", "blending_mixing", true, false, &blending});
}

}  // namespace trex::orkit::gen
