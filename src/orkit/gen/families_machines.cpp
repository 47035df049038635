// Assignment-type scheduling families: makespan on unrelated parallel machines (jobs with machine
// eligibility) and staff-to-shift assignment (coverage, one shift per day, workload limits).
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

// ------------------------------------------------------------------------------------------------
Instance machine_scheduling(Rng& rng, const GenRequest& req) {
  const int nj = size_for(rng, req.difficulty, 3, 5, 6, 8, 8, 10, 10, 12);
  const int nm = size_for(rng, req.difficulty, 2, 2, 2, 3, 3, 3, 3, 4);
  struct Theme {
    std::string shop, job, machine, unit;
  };
  static const std::vector<Theme> themes = {{"a print shop", "print order", "press", "minutes"},
                                            {"a machine shop", "work order", "CNC machine", "minutes"},
                                            {"a cloud provider", "batch job", "server", "seconds"},
                                            {"a laboratory", "sample batch", "analyser", "minutes"},
                                            {"a garment workshop", "order", "sewing line", "hours"}};
  const Theme& th = rng.pick(themes);
  std::vector<std::string> J, M;
  for (int j = 0; j < nj; ++j)
    J.push_back(fmt::format("{}{}", capitalize(th.job.substr(th.job.rfind(' ') + 1)), j + 1));
  for (int m = 0; m < nm; ++m)
    M.push_back(fmt::format("{}_{}", ident(capitalize(th.machine)), static_cast<char>('A' + m)));
  Instance in;
  in.family = "machine_scheduling";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = th.unit;
  json& d = in.data;
  d["jobs"] = J;
  d["machines"] = M;
  json el = json::array();
  for (int j = 0; j < nj; ++j) {
    const double base = rng.integer(5, 60);
    const int must = rng.integer(0, nm - 1);  // every job can run somewhere
    for (int m = 0; m < nm; ++m) {
      if (m != must && rng.chance(0.25)) continue;
      el.push_back({M[m], J[j]});
      d["time"][M[m]][J[j]] = std::max(1.0, std::round(base * rng.real(0.6, 1.6, 0.01)));
    }
  }
  d["eligible"] = el;
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "{shop_cap} has {nj} {job}s to process today on {nm} {machine}s ({M}). The {machine}s "
          "differ, so a job's processing time depends on where it runs, and some jobs cannot run on "
          "some {machine}s. Each job runs on one {machine} without interruption.",
          "At {shop}, {nj} {job}s must be split among the {machine}s {M}. Every job goes to exactly "
          "one {machine}; processing times are {machine}-specific and not every {machine} can do "
          "every job."})),
      fmt::arg("shop_cap", capitalize(th.shop)), fmt::arg("shop", th.shop), fmt::arg("nj", nj),
      fmt::arg("job", th.job), fmt::arg("nm", nm), fmt::arg("machine", th.machine),
      fmt::arg("M", join_and(M)));
  std::string inl;
  for (auto& j : J) {
    std::vector<std::string> v;
    for (auto& m : M)
      if (d["time"][m].contains(j))
        v.push_back(fmt::format("{} {} on {}", num(g(d["time"][m][j])), th.unit, m));
    inl += fmt::format("{} takes {}. ", j, join_and(v, "or"));
  }
  in.inline_data = inl + "A job cannot run on a machine not listed for it.";
  Table t{"Processing times (" + th.unit + "; '-' = cannot run there):", {"Job"}, {}};
  for (auto& m : M) t.header.push_back(m);
  for (auto& j : J) {
    std::vector<std::string> row{j};
    for (auto& m : M) row.push_back(d["time"][m].contains(j) ? num(g(d["time"][m][j])) : "-");
    t.rows.push_back(row);
  }
  in.tables = {t};
  in.question = fmt::format(
      "Assign the {}s to {}s so that the time at which the last {} finishes (the makespan) is "
      "as small as possible. What is the minimum makespan?",
      th.job, th.machine, th.machine);
  in.data_keys = {{"jobs", "jobs"},
                  {"machines", "machines"},
                  {"eligible", "list of [machine, job] pairs that are allowed"},
                  {"time", "time[machine][job]: processing time, only for eligible pairs"}};
  ModelBuilder mb("machine_scheduling", Sense::Minimize);
  const int cmax = mb.var("makespan");
  mb.obj(cmax, 1);
  std::map<std::pair<std::string, std::string>, int> x;
  for (auto& p : el) {
    const std::string m = p[0].get<std::string>(), j = p[1].get<std::string>();
    x[{m, j}] = mb.binary("assign_" + m + "_" + j);
  }
  for (auto& j : J) {
    const int r = mb.row("once_" + j, RowSense::EQ, 1);
    for (auto& m : M)
      if (x.count({m, j})) mb.add(r, x[{m, j}], 1);
  }
  for (auto& m : M) {
    const int r = mb.row("load_" + m, RowSense::LE, 0);
    for (auto& j : J)
      if (x.count({m, j})) mb.add(r, x[{m, j}], g(d["time"][m][j]));
    mb.add(r, cmax, -1);
  }
  in.model = mb.take();
  in.mathprog = R"(set jobs; set machines; set eligible within machines cross jobs;
param time{eligible};
var assign{eligible} binary;
var makespan >= 0;
minimize finish: makespan;
s.t. once{j in jobs}: sum{(m,k) in eligible: k = j} assign[m,k] = 1;
s.t. busy{m in machines}: sum{(a,j) in eligible: a = m} time[a,j] * assign[a,j] <= makespan;
)";
  in.formulation = R"(Sets:
- J: jobs; M: machines; E: eligible (machine, job) pairs.
Parameters:
- p_(m,j): processing time of job j on machine m ((m, j) in E).
Decision variables:
- x_(m,j) binary: job j runs on machine m; C_max >= 0 continuous: makespan.
Objective:
- minimize C_max
Constraints:
- every job on exactly one eligible machine: sum_(m:(m,j) in E) x_(m,j) = 1
- machine load: sum_(j:(m,j) in E) p_(m,j) * x_(m,j) <= C_max for every machine m)";
  in.python_body = R"(J = data["jobs"]
M = data["machines"]
E = [tuple(p) for p in data["eligible"]]
p = data["time"]
model = gp.Model("machine_scheduling")
x = model.addVars(E, lb=0, ub=1, vtype=GRB.BINARY, name="assign")
cmax = model.addVar(lb=0, ub=GRB.INFINITY, name="makespan")
model.setObjective(cmax, GRB.MINIMIZE)
for j in J:
    model.addConstr(x.sum("*", j) == 1, name=f"once_{j}")
for m in M:
    model.addConstr(gp.quicksum(p[m][j] * x[m, j] for (a, j) in E if a == m) <= cmax, name=f"load_{m}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Unrelated parallel machines, minimise makespan: {} jobs, {} machines.", nj, nm),
      {"Binary assignment variables only for eligible (machine, job) pairs.",
       "A continuous makespan variable bounds every machine's total load (min-max linearisation).",
       "Job order on a machine does not change the makespan, so no sequencing variables are needed."});
  return in;
}

// ------------------------------------------------------------------------------------------------
Instance staff_assignment(Rng& rng, const GenRequest& req) {
  static const std::vector<std::string> people = {
      "Alice", "Bruno", "Chen",  "Dana",  "Emil", "Farah", "Goran", "Hiro", "Isla", "Jonas", "Kemal", "Lina",
      "Mateo", "Noor",  "Oskar", "Priya", "Rafa", "Sofia", "Tomas", "Ulla", "Vera", "Wen",   "Yusuf", "Zara"};
  static const std::vector<std::string> all_days = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
  const int ne = size_for(rng, req.difficulty, 3, 4, 5, 7, 8, 12, 12, 18);
  const int nd = size_for(rng, req.difficulty, 2, 2, 2, 3, 3, 5, 5, 7);
  const bool two_shifts = rng.chance(0.6);
  auto E = rng.sample(people, ne);
  std::vector<std::string> D(all_days.begin(), all_days.begin() + nd), S;
  Instance in;
  in.family = "staff_assignment";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = "dollars";
  json& d = in.data;
  d["employees"] = E;
  d["days"] = D;
  for (auto& day : D)
    for (const char* part :
         two_shifts ? std::vector<const char*>{"Early", "Late"} : std::vector<const char*>{"Day"}) {
      S.push_back(day + "_" + part);
      d["shifts_on"][day].push_back(S.back());
    }
  d["shifts"] = S;
  for (auto& e : E) d["max_shifts"][e] = rng.integer(std::max(1, nd / 2), nd);
  // Reference roster: each shift takes the employees it needs among those still free that day and under
  // their limit; availability always includes the reference roster, so the instance is feasible.
  std::map<std::string, int> worked;
  std::set<std::pair<std::string, std::string>> busy_day, avail;
  for (auto& day : D)
    for (auto& s : d["shifts_on"][day]) {
      const std::string sh = s.get<std::string>();
      std::vector<std::string> cand = E;
      rng.shuffle(cand);
      const int want =
          rng.integer(1, std::max(1, std::min(3, ne / (2 * static_cast<int>(d["shifts_on"][day].size())))));
      int got = 0;
      for (auto& e : cand) {
        if (got == want) break;
        if (busy_day.count({e, day}) || worked[e] >= d["max_shifts"][e].get<int>()) continue;
        busy_day.insert({e, day});
        worked[e]++;
        avail.insert({e, sh});
        ++got;
      }
      d["required"][sh] = std::max(got, 0);
    }
  for (auto& e : E)
    for (auto& s : S)
      if (rng.chance(0.5)) avail.insert({e, s});
  json al = json::array();
  for (auto& e : E)
    for (auto& s : S)
      if (avail.count({e, s})) {
        al.push_back({e, s});
        d["cost"][e][s] = rng.integer(80, 200);
      }
  d["available"] = al;
  if (req.target == Expected::Infeasible) {
    const std::string& s = S[rng.integer(0, static_cast<int>(S.size()) - 1)];
    int count = 0;
    for (auto& p : al)
      if (p[1] == s) ++count;
    d["required"][s] = count + 1;
    in.expected = Expected::Infeasible;
    in.status_reason =
        fmt::format("only {} employees are available for {}, which needs {}", count, s, count + 1);
  }
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "A restaurant manager builds next week's roster for {ne} employees ({E}) over {nd} days, "
          "{per}. Employees have told the manager which shifts they can work; each has a limit on "
          "shifts per week and nobody works two shifts on the same day. Pay differs by person and "
          "shift (seniority, unsocial hours).",
          "A small clinic must staff its shifts ({per}) on {nd} days with {ne} people: {E}. Each "
          "shift needs a minimum number of staff; people work only shifts they are available for, "
          "at most one per day and no more than their weekly maximum."})),
      fmt::arg("ne", ne), fmt::arg("E", join_and(E)), fmt::arg("nd", nd),
      fmt::arg("per", two_shifts ? "an early and a late shift per day" : "one shift per day"));
  std::string inl;
  for (auto& s : S) inl += fmt::format("{} needs {} staff. ", s, num(g(d["required"][s])));
  for (auto& e : E) {
    std::vector<std::string> v;
    for (auto& s : S)
      if (avail.count({e, s})) v.push_back(fmt::format("{} ({})", s, money(g(d["cost"][e][s]))));
    inl += fmt::format("{} can work at most {} shifts and is available for {}. ", e,
                       num(g(d["max_shifts"][e])), v.empty() ? "no shift" : join_and(v));
  }
  in.inline_data = inl + "The amount in brackets is the pay for that shift.";
  Table t1{"Pay per shift ($; '-' = not available):", {"Employee"}, {}};
  for (auto& s : S) t1.header.push_back(s);
  t1.header.push_back("Max shifts");
  for (auto& e : E) {
    std::vector<std::string> row{e};
    for (auto& s : S) row.push_back(avail.count({e, s}) ? num(g(d["cost"][e][s])) : "-");
    row.push_back(num(g(d["max_shifts"][e])));
    t1.rows.push_back(row);
  }
  Table t2{"Staff required:", {"Shift", "Required"}, {}};
  for (auto& s : S) t2.rows.push_back({s, num(g(d["required"][s]))});
  in.tables = {t1, t2};
  in.question = "Which roster covers every shift at minimum total pay?";
  in.data_keys = {{"employees", "employees"},
                  {"days", "days"},
                  {"shifts", "shifts"},
                  {"shifts_on", "shifts_on[day]: the shifts of that day"},
                  {"max_shifts", "weekly limit per employee"},
                  {"required", "staff needed per shift"},
                  {"available", "list of [employee, shift] pairs allowed"},
                  {"cost", "cost[employee][shift]: pay, only for available pairs"}};
  ModelBuilder mb("staff_assignment", Sense::Minimize);
  std::map<std::pair<std::string, std::string>, int> x;
  for (auto& p : al) {
    const std::string e = p[0], s = p[1];
    mb.obj(x[{e, s}] = mb.binary("work_" + e + "_" + s), g(d["cost"][e][s]));
  }
  for (auto& s : S) {
    const int r = mb.row("cover_" + s, RowSense::GE, g(d["required"][s]));
    for (auto& e : E)
      if (x.count({e, s})) mb.add(r, x[{e, s}], 1);
  }
  for (auto& e : E) {
    const int r = mb.row("limit_" + e, RowSense::LE, g(d["max_shifts"][e]));
    for (auto& s : S)
      if (x.count({e, s})) mb.add(r, x[{e, s}], 1);
    for (auto& day : D) {
      const int rd = mb.row("oneaday_" + e + "_" + day, RowSense::LE, 1);
      for (auto& s : d["shifts_on"][day])
        if (x.count({e, s.get<std::string>()})) mb.add(rd, x[{e, s.get<std::string>()}], 1);
    }
  }
  in.model = mb.take();
  in.mathprog = R"(set employees; set days; set shifts; set shifts_on{days} within shifts;
set available within employees cross shifts;
param max_shifts{employees}; param required{shifts}; param cost{available};
var work{available} binary;
minimize pay: sum{(e,s) in available} cost[e,s] * work[e,s];
s.t. cover{s in shifts}: sum{(e,t) in available: t = s} work[e,t] >= required[s];
s.t. limit{e in employees}: sum{(a,s) in available: a = e} work[a,s] <= max_shifts[e];
s.t. one_a_day{e in employees, d in days}: sum{(a,s) in available: a = e and s in shifts_on[d]} work[a,s] <= 1;
)";
  in.formulation = R"(Sets:
- E: employees; D: days; S: shifts; S_d: shifts of day d; A: available (employee, shift) pairs.
Parameters:
- c_(e,s): pay; r_s: staff required; m_e: weekly shift limit.
Decision variables:
- x_(e,s) binary for (e, s) in A: employee e works shift s.
Objective:
- minimize sum_((e,s) in A) c_(e,s) * x_(e,s)
Constraints:
- coverage: sum_(e:(e,s) in A) x_(e,s) >= r_s
- workload: sum_(s:(e,s) in A) x_(e,s) <= m_e
- one shift per day: sum_(s in S_d:(e,s) in A) x_(e,s) <= 1 for every e, d)";
  in.python_body = R"(E = data["employees"]
S = data["shifts"]
A = [tuple(p) for p in data["available"]]
model = gp.Model("staff_assignment")
x = model.addVars(A, lb=0, ub=1, vtype=GRB.BINARY, name="work")
model.setObjective(gp.quicksum(data["cost"][e][s] * x[e, s] for (e, s) in A), GRB.MINIMIZE)
for s in S:
    model.addConstr(x.sum("*", s) >= data["required"][s], name=f"cover_{s}")
for e in E:
    model.addConstr(x.sum(e, "*") <= data["max_shifts"][e], name=f"limit_{e}")
    for day in data["days"]:
        model.addConstr(gp.quicksum(x[e, s] for s in data["shifts_on"][day] if (e, s) in x) <= 1,
                        name=f"oneaday_{e}_{day}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Staff-to-shift assignment: {} employees, {} shifts over {} days.", ne, S.size(), nd),
      {"Binary x_(e,s) only where the employee is available.", "Minimise pay.",
       "Coverage >= required per shift; weekly limit per employee; at most one shift per employee and day."});
  return in;
}

}  // namespace

void add_machine_families(std::vector<Family>& out) {
  out.push_back({"machine_scheduling", "scheduling", false, false, &machine_scheduling});
  out.push_back({"staff_assignment", "assignment", true, false, &staff_assignment});
}

}  // namespace trex::orkit::gen
