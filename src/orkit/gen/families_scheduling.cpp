// Scheduling and inventory families: lot sizing with setups, cyclic workforce shift scheduling.
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

// ------------------------------------------------------------------------------------------------
Instance lot_sizing(Rng& rng, const GenRequest& req) {
  const int T = size_for(rng, req.difficulty, 3, 4, 5, 8, 9, 12, 14, 18);
  static const std::vector<std::string> months = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                  "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::vector<std::string> P;
  const int start = rng.integer(0, 11);
  for (int t = 0; t < T; ++t) P.push_back(fmt::format("{}{}", months[(start + t) % 12], t / 12 + 1));
  Instance in;
  in.family = "lot_sizing";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["periods"] = P;
  double tot = 0;
  for (auto& p : P) {
    d["demand"][p] = rng.integer(20, 120);
    tot += d["demand"][p].get<double>();
  }
  const bool infeasible = req.target == Expected::Infeasible;
  for (int t = 0; t < T; ++t) {
    d["capacity"][P[t]] = infeasible ? std::round(tot / T * 0.8) : std::round(tot / T * rng.real(1.3, 2.0, 0.01));
    d["setup_cost"][P[t]] = rng.integer(50, 400);
    d["unit_cost"][P[t]] = rng.real(2, 8, 0.5);
    d["holding_cost"][P[t]] = rng.real(0.5, 3, 0.5);
    d["rank"][P[t]] = t + 1;
  }
  if (!infeasible) {
    // No initial stock: every prefix of the horizon must be able to produce its own cumulative demand,
    // else an early demand peak makes the plan infeasible (the cause of the lot-sizing rejections).
    double cum_cap = 0, cum_dem = 0;
    for (int t = 0; t < T; ++t) {
      cum_cap += d["capacity"][P[t]].get<double>();
      cum_dem += d["demand"][P[t]].get<double>();
      if (cum_cap < cum_dem) {
        d["capacity"][P[t]] = d["capacity"][P[t]].get<double>() + (cum_dem - cum_cap);
        cum_cap = cum_dem;
      }
    }
  }
  if (infeasible) {
    in.expected = Expected::Infeasible;
    in.status_reason = fmt::format("total demand {} exceeds total production capacity {} over the horizon",
                                   num(tot), num(std::round(tot / T * 0.8) * T));
  }
  in.story = fmt::format(
      "A plant plans production of one product over the next {} periods. Producing in a period incurs a setup "
      "cost plus a unit cost; units kept in stock at the end of a period incur a holding cost. Demand must be "
      "met on time (no backorders), there is no initial stock, and production is limited by the period capacity.",
      T);
  std::string inl;
  for (auto& p : P)
    inl += fmt::format("{}: demand {}, capacity {}, setup {}, unit cost {}, holding {} per unit. ", p,
                       num(d["demand"][p].get<double>()), num(d["capacity"][p].get<double>()),
                       money(d["setup_cost"][p].get<double>()), money(d["unit_cost"][p].get<double>()),
                       money(d["holding_cost"][p].get<double>()));
  in.inline_data = inl;
  Table t{"Period data:", {"Period", "Demand", "Capacity", "Setup ($)", "Unit cost ($)", "Holding ($/unit)"}, {}};
  for (auto& p : P)
    t.rows.push_back({p, num(d["demand"][p].get<double>()), num(d["capacity"][p].get<double>()),
                      num(d["setup_cost"][p].get<double>()), num(d["unit_cost"][p].get<double>()),
                      num(d["holding_cost"][p].get<double>())});
  in.tables = {t};
  in.question = "Find the production plan of minimum total cost.";
  in.data_keys = {{"periods", "list of periods in time order"}, {"demand", "demand per period"},
                  {"capacity", "production capacity per period"}, {"setup_cost", "setup cost per period"},
                  {"unit_cost", "production cost per unit"}, {"holding_cost", "cost per unit in stock at period end"},
                  {"rank", "position of each period (1, 2, ...)"}};
  ModelBuilder mb("lot_sizing", Sense::Minimize);
  std::vector<int> x, s, y;
  for (auto& p : P) {
    x.push_back(mb.var("produce_" + p));
    s.push_back(mb.var("stock_" + p));
    y.push_back(mb.binary("setup_" + p));
    mb.obj(x.back(), d["unit_cost"][p].get<double>());
    mb.obj(s.back(), d["holding_cost"][p].get<double>());
    mb.obj(y.back(), d["setup_cost"][p].get<double>());
  }
  for (int k = 0; k < T; ++k) {
    int r = mb.row("balance_" + P[k], RowSense::EQ, d["demand"][P[k]].get<double>());
    mb.add(r, x[k], 1);
    mb.add(r, s[k], -1);
    if (k > 0) mb.add(r, s[k - 1], 1);
    int c = mb.row("setup_link_" + P[k], RowSense::LE, 0);
    mb.add(c, x[k], 1);
    mb.add(c, y[k], -d["capacity"][P[k]].get<double>());
  }
  in.model = mb.take();
  in.mathprog = R"(set periods;
param demand{periods}; param capacity{periods}; param setup_cost{periods};
param unit_cost{periods}; param holding_cost{periods}; param rank{periods};
var produce{periods} >= 0; var stock{periods} >= 0; var setup{periods} binary;
minimize cost: sum{t in periods} (unit_cost[t] * produce[t] + holding_cost[t] * stock[t] + setup_cost[t] * setup[t]);
s.t. balance{t in periods}:
  sum{u in periods: rank[u] = rank[t] - 1} stock[u] + produce[t] - stock[t] = demand[t];
s.t. link{t in periods}: produce[t] <= capacity[t] * setup[t];
)";
  in.formulation = R"(Sets:
- T: periods in order.
Parameters:
- d_t demand, C_t capacity, f_t setup cost, c_t unit cost, h_t holding cost.
Decision variables:
- x_t >= 0 production, s_t >= 0 end-of-period stock (continuous); y_t binary setup.
Objective:
- minimize sum_t (c_t x_t + h_t s_t + f_t y_t)
Constraints:
- inventory balance: s_(t-1) + x_t - s_t = d_t (s_0 = 0)
- setup forcing: x_t <= C_t * y_t)";
  in.python_body = R"(T = data["periods"]
model = gp.Model("lot_sizing")
x = model.addVars(T, lb=0, ub=GRB.INFINITY, name="produce")
s = model.addVars(T, lb=0, ub=GRB.INFINITY, name="stock")
y = model.addVars(T, lb=0, ub=1, vtype=GRB.BINARY, name="setup")
model.setObjective(gp.quicksum(data["unit_cost"][t] * x[t] + data["holding_cost"][t] * s[t]
                               + data["setup_cost"][t] * y[t] for t in T), GRB.MINIMIZE)
for k, t in enumerate(T):
    previous = s[T[k - 1]] if k > 0 else 0
    model.addConstr(previous + x[t] - s[t] == data["demand"][t], name=f"balance_{t}")
    model.addConstr(x[t] <= data["capacity"][t] * y[t], name=f"setup_link_{t}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Capacitated single-item lot sizing over {} periods.", T),
      {"Production x_t and stock s_t are continuous; the setup y_t is binary.",
       "Minimise unit, holding and setup costs.", "Inventory balance links consecutive periods (no initial stock).",
       "x_t <= C_t y_t: production needs a setup and respects capacity."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance workforce_shift(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> days = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
  const int work = rng.chance(0.7) ? 5 : 4;  // consecutive working days per shift pattern
  static const std::vector<std::string> who = {"nurses", "call-centre agents", "bus drivers", "security guards",
                                               "warehouse pickers"};
  const std::string staff = rng.pick(who);
  const double scale = req.difficulty == Difficulty::Small ? 1 : req.difficulty == Difficulty::Medium ? 3 : 8;
  Instance in;
  in.family = "workforce_shift";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "staff";
  json& d = in.data;
  d["days"] = days;
  for (auto& dd : days) d["required"][dd] = std::round(rng.integer(8, 25) * scale);
  // Pattern p starts on day p and covers `work` consecutive days (cyclic week).
  for (int p = 0; p < 7; ++p)
    for (int k = 0; k < work; ++k) d["covers"][days[p]][days[(p + k) % 7]] = 1;
  const bool weighted = rng.chance(0.5);
  for (auto& dd : days) d["cost"][dd] = weighted ? (dd == "Sat" || dd == "Sun" ? 1.2 : 1.0) : 1.0;
  in.story = fmt::format(
      "A service must roster {}. Each employee works {} consecutive days and then has {} days off, in a "
      "weekly cycle, so an employee is characterised by the day the working stretch starts.{}",
      staff, work, 7 - work,
      weighted ? " Stretches that start on a weekend day cost 20% more (weekend premium)." : "");
  std::vector<std::string> req_s;
  for (auto& dd : days) req_s.push_back(fmt::format("{} on {}", num(d["required"][dd].get<double>()), dd));
  in.inline_data = "At least " + join_and(req_s) + " must be on duty.";
  Table t{"Minimum staff on duty:", {"Day", "Required"}, {}};
  for (auto& dd : days) t.rows.push_back({dd, num(d["required"][dd].get<double>())});
  in.tables = {t};
  in.question = weighted ? "How many employees should start on each day to meet the requirements at minimum "
                           "cost (weekday starts cost 1, weekend starts 1.2)?"
                         : "What is the minimum number of employees needed, and on which days should they start?";
  in.data_keys = {{"days", "days of the week"}, {"required", "minimum staff on duty per day"},
                  {"covers", "covers[start][day] = 1 if a stretch starting on `start` works on `day`"},
                  {"cost", "cost of one employee by start day"}};
  ModelBuilder mb("workforce_shift", Sense::Minimize);
  std::vector<int> x;
  for (int p = 0; p < 7; ++p) {
    x.push_back(mb.integer("start_" + days[p]));
    mb.obj(x.back(), d["cost"][days[p]].get<double>());
  }
  for (int q = 0; q < 7; ++q) {
    int r = mb.row("cover_" + days[q], RowSense::GE, d["required"][days[q]].get<double>());
    for (int p = 0; p < 7; ++p) {
      const int offset = (q - p + 7) % 7;
      if (offset < work) mb.add(r, x[p], 1);
    }
  }
  in.model = mb.take();
  in.mathprog = R"(set days;
param required{days}; param covers{days, days} default 0; param cost{days};
var start{days} >= 0, integer;
minimize total: sum{p in days} cost[p] * start[p];
s.t. cover{q in days}: sum{p in days} covers[p,q] * start[p] >= required[q];
)";
  in.formulation = R"(Sets:
- D: days of the week (cyclic).
Parameters:
- r_q: staff required on day q; a_(p,q) = 1 if a stretch starting on day p works on day q; c_p: cost by start day.
Decision variables:
- x_p >= 0 integer: employees whose stretch starts on day p.
Objective:
- minimize sum_p c_p * x_p
Constraints:
- coverage: sum_p a_(p,q) * x_p >= r_q for every day q)";
  in.python_body = R"(D = data["days"]
model = gp.Model("workforce_shift")
x = model.addVars(D, lb=0, ub=GRB.INFINITY, vtype=GRB.INTEGER, name="start")
model.setObjective(gp.quicksum(data["cost"][p] * x[p] for p in D), GRB.MINIMIZE)
for q in D:
    model.addConstr(gp.quicksum(data["covers"][p].get(q, 0) * x[p] for p in D) >= data["required"][q],
                    name=f"cover_{q}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Cyclic staffing: {}-day working stretches, 7 possible start days.", work),
      {"Integer x_p = employees starting on day p (people are indivisible).",
       weighted ? "Minimise cost with the weekend premium." : "Minimise the head count.",
       fmt::format("Day q is covered by the starts p with (q - p) mod 7 < {}.", work)});
  return in;
}

}  // namespace

void add_scheduling_families(std::vector<Family>& out) {
  out.push_back({"lot_sizing", "inventory_balance", true, false, &lot_sizing});
  out.push_back({"workforce_shift", "scheduling", false, false, &workforce_shift});
}

}  // namespace trex::orkit::gen
