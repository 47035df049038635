// Allocation families: production planning, crop planning, media allocation, diet, blending, portfolio.
// Each generator draws data, describes it three ways, builds the route-1 model in C++ and carries a
// symbolic MathProg model for route 2.
#include <cmath>

#include <fmt/format.h>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

struct Resource {
  std::string name, unit;
};

// ------------------------------------------------------------------------------------------------
// Production planning: max profit s.t. resource capacities, market limits, minimum commitments.
// ------------------------------------------------------------------------------------------------
struct ProdTheme {
  std::string firm, period, unit;
  std::vector<std::string> products;
  std::vector<Resource> resources;
  double profit_lo, profit_hi;
};

const std::vector<ProdTheme>& prod_themes() {
  static const std::vector<ProdTheme> t = {
      {"a furniture workshop", "week", "piece",
       {"Chair", "Table", "Desk", "Bookshelf", "Cabinet", "Stool", "Bench", "Wardrobe", "Dresser", "Bed", "Sofa",
        "Shelf", "Nightstand", "Armchair"},
       {{"carpentry", "hours"}, {"finishing", "hours"}, {"timber", "board-feet"}, {"upholstery", "hours"},
        {"packing", "hours"}, {"varnish", "litres"}},
       20, 160},
      {"an electronics plant", "day", "unit",
       {"Router", "Modem", "Switch", "Tablet", "Speaker", "Charger", "Camera", "Drone", "Monitor", "Keyboard",
        "Headset", "Sensor", "Thermostat", "Smartwatch"},
       {{"SMT line", "minutes"}, {"assembly", "minutes"}, {"testing", "minutes"}, {"chip stock", "chips"},
        {"packaging", "minutes"}, {"burn-in", "minutes"}},
       5, 90},
      {"an artisan bakery", "day", "batch",
       {"Sourdough", "Baguette", "Croissant", "Brioche", "Rye", "Focaccia", "Bagel", "Muffin", "Scone", "Ciabatta",
        "Pretzel", "Danish", "Cookie", "Pita"},
       {{"oven", "minutes"}, {"flour", "kg"}, {"labour", "minutes"}, {"butter", "kg"}, {"proofing", "minutes"},
        {"mixer", "minutes"}},
       8, 60},
      {"a chemical company", "month", "ton",
       {"Solvent", "Resin", "Adhesive", "Coating", "Cleaner", "Lubricant", "Sealant", "Primer", "Dye", "Glaze",
        "Fertiliser", "Detergent", "Polish", "Wax"},
       {{"reactor", "hours"}, {"distillation", "hours"}, {"feedstock", "tons"}, {"storage", "cubic metres"},
        {"quality lab", "hours"}, {"catalyst", "kg"}},
       50, 400},
      {"a garment factory", "week", "garment",
       {"Shirt", "Jacket", "Dress", "Trousers", "Skirt", "Coat", "Blouse", "Hoodie", "Vest", "Jeans", "Scarf",
        "Polo", "Cardigan", "Shorts"},
       {{"cutting", "hours"}, {"sewing", "hours"}, {"fabric", "metres"}, {"pressing", "hours"},
        {"inspection", "hours"}, {"dyeing", "hours"}},
       4, 45},
  };
  return t;
}

Instance production_planning(Rng& rng, const GenRequest& req) {
  const ProdTheme& th = rng.pick(prod_themes());
  const int n = size_for(rng, req.difficulty, 2, 3, 3, 5, 6, 9, 10, 14);
  const int m = std::min<int>(th.resources.size(), size_for(rng, req.difficulty, 2, 2, 2, 3, 3, 5, 4, 6));
  const bool integer = rng.chance(0.5);
  auto products = rng.sample(th.products, n);
  std::vector<Resource> res = th.resources;
  rng.shuffle(res);
  res.resize(m);

  Instance in;
  in.family = "production_planning";
  in.problem_class = integer ? "MILP" : "LP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["products"] = products;
  std::vector<std::string> rnames;
  for (auto& r : res) rnames.push_back(r.name);
  d["resources"] = rnames;
  for (auto& p : products) d["profit"][p] = rng.real(th.profit_lo, th.profit_hi, 1);
  for (auto& r : rnames)
    for (auto& p : products) d["usage"][r][p] = rng.chance(0.15) ? 0.0 : rng.real(0.5, 8, 0.5);
  // Every product needs some resource; a product that needs none and has no market limit makes the
  // intended-optimal LP unbounded (the cause of the production-planning rejections).
  for (auto& p : products) {
    bool uses = false;
    for (auto& r : rnames) uses = uses || d["usage"][r][p].get<double>() > 0;
    if (!uses) d["usage"][rnames[rng.integer(0, m - 1)]][p] = rng.real(0.5, 8, 0.5);
  }
  // Capacities sized so that roughly 10-30 units of everything fit.
  for (auto& r : rnames) {
    double need = 0;
    for (auto& p : products) need += d["usage"][r][p].get<double>();
    d["capacity"][r] = std::max(10.0, std::round(need * rng.real(6, 20, 1)));
  }
  const bool unbounded = req.target == Expected::Unbounded && !integer;
  std::string free_product;
  if (unbounded) {
    free_product = products[rng.integer(0, n - 1)];
    for (auto& r : rnames) d["usage"][r][free_product] = 0.0;
    in.expected = Expected::Unbounded;
    in.status_reason = fmt::format(
        "{} earns a positive profit, uses none of the limited resources and has no market limit, so its "
        "production (and the profit) can grow without bound",
        free_product);
  }
  for (auto& p : products)
    if (p != free_product && rng.chance(0.5)) d["max_demand"][p] = rng.integer(5, 60);
  if (req.target == Expected::Infeasible) {
    // Commit to a minimum quantity of every product, needing ~30% more of resource r than it offers.
    const int ri = rng.integer(0, m - 1);
    const std::string& r = rnames[ri];
    double need = 0;
    for (auto& p : products) need += d["usage"][r][p].get<double>();
    if (need == 0) {  // no product uses r: make the first product use it
      d["usage"][r][products[0]] = 1.0;
      need = 1.0;
    }
    const double q = std::ceil(d["capacity"][r].get<double>() * 1.3 / need);
    double used = 0;
    for (auto& p : products) {
      if (d.contains("max_demand") && d["max_demand"].contains(p))
        d["max_demand"][p] = std::max(d["max_demand"][p].get<double>(), q);
      d["min_production"][p] = q;
      used += d["usage"][r][p].get<double>() * q;
    }
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("the committed minimum quantities need {} {} of {} but only {} are available",
                                   num(used), res[ri].unit, r, num(d["capacity"][r].get<double>()));
  } else if (rng.chance(0.3)) {
    const std::string& p = products[rng.integer(0, n - 1)];
    if (p != free_product) d["min_production"][p] = rng.integer(1, 4);
  }

  // ---- prose
  const std::string unit = th.unit;
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "{firm_cap} makes {list}. Each {unit} brings a fixed profit and takes up some of the {res} that are "
          "available every {period}. The planner wants the production plan for next {period} that earns the "
          "most profit.",
          "The operations manager of {firm} must decide how much of each product ({list}) to make next "
          "{period}. Products compete for limited {res}.",
          "{firm_cap} is planning next {period}'s output of {list}, subject to the availability of {res}."})),
      fmt::arg("firm_cap", capitalize(th.firm)), fmt::arg("firm", th.firm), fmt::arg("list", join_and(products)),
      fmt::arg("unit", unit), fmt::arg("res", join_and(rnames)), fmt::arg("period", th.period));
  auto unit_of = [&](const std::string& r) {
    for (auto& x : res)
      if (x.name == r) return x.unit;
    return std::string();
  };
  std::string inl;
  for (auto& p : products) {
    std::vector<std::string> uses;
    for (auto& r : rnames) {
      double a = d["usage"][r][p].get<double>();
      if (a > 0) uses.push_back(fmt::format("{} {} of {}", num(a), unit_of(r), r));
    }
    inl += fmt::format("Each {} of {} earns {} and {}. ", unit, p, money(d["profit"][p].get<double>()),
                       uses.empty() ? "uses none of these resources" : "requires " + join_and(uses));
  }
  std::vector<std::string> caps;
  for (auto& r : rnames) caps.push_back(fmt::format("{} {} of {}", num(d["capacity"][r].get<double>()), unit_of(r), r));
  inl += fmt::format("Every {} there are {} available. ", th.period, join_and(caps));
  std::vector<std::string> dem, com;
  if (d.contains("max_demand"))
    for (auto& [p, v] : d["max_demand"].items()) dem.push_back(fmt::format("{} {}s of {}", num(v.get<double>()), unit, p));
  if (d.contains("min_production"))
    for (auto& [p, v] : d["min_production"].items()) com.push_back(fmt::format("{} of {}", num(v.get<double>()), p));
  std::string limits;
  if (!dem.empty()) limits += fmt::format("The market will take at most {}. ", join_and(dem));
  if (!com.empty()) limits += fmt::format("Contracts already signed require at least {} {}s to be made. ", join_and(com), unit);
  in.inline_data = inl + limits;
  Table t1{"Per-" + unit + " profit and resource use:", {"Product", "Profit ($)"}, {}};
  for (auto& r : rnames) t1.header.push_back(capitalize(r) + " (" + unit_of(r) + ")");
  for (auto& p : products) {
    std::vector<std::string> row{p, num(d["profit"][p].get<double>())};
    for (auto& r : rnames) row.push_back(num(d["usage"][r][p].get<double>()));
    t1.rows.push_back(row);
  }
  Table t2{"Availability per " + th.period + ":", {"Resource", "Available"}, {}};
  for (auto& r : rnames) t2.rows.push_back({r, num(d["capacity"][r].get<double>()) + " " + unit_of(r)});
  in.tables = {t1, t2};
  in.table_lead = limits;
  in.question = integer ? fmt::format("Only whole {}s can be made. How many of each product should be made to maximise total profit?", unit)
                        : "Fractional quantities are allowed. How much of each product should be made to maximise total profit?";
  in.data_keys = {{"products", "list of product names"},
                  {"resources", "list of resource names"},
                  {"profit", "profit per unit, keyed by product"},
                  {"usage", "usage[resource][product]: amount of the resource one unit of the product needs"},
                  {"capacity", "amount of each resource available, keyed by resource"},
                  {"max_demand", "market limit, keyed by product (products without an entry are unlimited)"},
                  {"min_production", "committed minimum quantity, keyed by product (absent = 0; key may be missing)"}};

  // ---- route 1
  ModelBuilder mb("production_planning", Sense::Maximize);
  std::map<std::string, int> x;
  for (auto& p : products) {
    x[p] = mb.var("x_" + p, 0.0, kInf, integer ? VarType::Integer : VarType::Continuous);
    mb.obj(x[p], d["profit"][p].get<double>());
  }
  for (auto& r : rnames) {
    int row = mb.row("cap_" + r, RowSense::LE, d["capacity"][r].get<double>());
    for (auto& p : products) mb.add(row, x[p], d["usage"][r][p].get<double>());
  }
  if (d.contains("max_demand"))
    for (auto& [p, v] : d["max_demand"].items()) mb.add(mb.row("demand_" + p, RowSense::LE, v.get<double>()), x[p], 1.0);
  if (d.contains("min_production"))
    for (auto& [p, v] : d["min_production"].items()) mb.add(mb.row("commit_" + p, RowSense::GE, v.get<double>()), x[p], 1.0);
  in.model = mb.take();

  // ---- route 2
  in.mathprog = std::string(R"(set products; set resources;
param profit{products};
param usage{resources, products} default 0;
param capacity{resources};
param max_demand{products} default -1;
param min_production{products} default 0;
var x{products} >= 0)") + (integer ? ", integer" : "") + R"(;
maximize total_profit: sum{p in products} profit[p] * x[p];
s.t. cap{r in resources}: sum{p in products} usage[r,p] * x[p] <= capacity[r];
s.t. market{p in products: max_demand[p] >= 0}: x[p] <= max_demand[p];
s.t. commit{p in products}: x[p] >= min_production[p];
)";
  const std::string vt = integer ? "non-negative integer" : "non-negative continuous";
  in.formulation = fmt::format(R"(Sets:
- P: products; R: resources.
Parameters:
- profit_p: profit per {0} of product p.
- a_(r,p): amount of resource r used by one {0} of product p; b_r: amount of resource r available.
- u_p: market limit of product p (only for products that have one); l_p: committed minimum (0 if none).
Decision variables:
- x_p: {0}s of product p to make, {1}.
Objective:
- maximize sum_(p in P) profit_p * x_p
Constraints:
- resource capacity: sum_(p in P) a_(r,p) * x_p <= b_r for every r in R
- market limit: x_p <= u_p for every product with a limit
- commitment: x_p >= l_p for every p in P)",
                                 unit, vt);
  in.python_body = fmt::format(R"(P = data["products"]
R = data["resources"]
model = gp.Model("production_planning")
x = model.addVars(P, lb=0, ub=GRB.INFINITY, vtype={}, name="x")
model.setObjective(gp.quicksum(data["profit"][p] * x[p] for p in P), GRB.MAXIMIZE)
for r in R:
    model.addConstr(gp.quicksum(data["usage"][r][p] * x[p] for p in P) <= data["capacity"][r], name=f"cap_{{r}}")
for p, limit in data.get("max_demand", {{}}).items():
    model.addConstr(x[p] <= limit, name=f"market_{{p}}")
for p, low in data.get("min_production", {{}}).items():
    model.addConstr(x[p] >= low, name=f"commit_{{p}}")
model.optimize()
)",
                               integer ? "GRB.INTEGER" : "GRB.CONTINUOUS");
  in.reasoning = bullet_reasoning(
      fmt::format("We choose how much of each of the {} products to make so as to maximise profit.", n),
      {fmt::format("Variables: x_p for each product, {} ({}).", vt,
                   integer ? "only whole units can be made" : "fractional quantities are allowed"),
       fmt::format("Objective: maximise total profit sum profit_p x_p."),
       fmt::format("Each of the {} resources gives a capacity row sum_p a_(r,p) x_p <= b_r.", m),
       dem.empty() ? "No product has a market limit." : fmt::format("{} products have an upper market limit.", dem.size()),
       com.empty() ? "There are no minimum commitments." : fmt::format("{} products have a committed minimum.", com.size())});
  return in;
}

}  // namespace

void add_allocation_families(std::vector<Family>& out) {
  out.push_back({"production_planning", "production_planning", true, true, &production_planning});
}

}  // namespace trex::orkit::gen
