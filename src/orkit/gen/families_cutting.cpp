// Cutting stock (Gilmore-Gomory, pattern-based, small): stock rolls of one width are cut into ordered
// widths. The generator enumerates every maximal cutting pattern (few, since pieces are at least a sixth
// of the roll) and states them as data; the model chooses how many rolls to cut with each pattern.
// Route 2 re-checks in MathProg that every pattern fits the roll before solving.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "orkit/gen/builder.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

double g(const json& j) {
  return j.get<double>();
}

// All patterns (piece counts) that fit `width` and leave less than the narrowest piece unused.
std::vector<std::vector<int>> maximal_patterns(const std::vector<int>& w, int width) {
  std::vector<std::vector<int>> out;
  const int narrow = *std::min_element(w.begin(), w.end());
  std::vector<int> cur(w.size(), 0);
  std::function<void(size_t, int)> rec = [&](size_t i, int left) {
    if (i == w.size()) {
      if (left < narrow) out.push_back(cur);
      return;
    }
    for (int k = left / w[i]; k >= 0; --k) {
      cur[i] = k;
      rec(i + 1, left - k * w[i]);
    }
    cur[i] = 0;
  };
  rec(0, width);
  return out;
}

Instance cutting_stock(Rng& rng, const GenRequest& req) {
  struct Theme {
    std::string firm, stock, piece, unit;
  };
  static const std::vector<Theme> themes = {{"a paper mill", "jumbo roll", "roll", "cm"},
                                            {"a steel service centre", "coil", "strip", "mm"},
                                            {"a textile converter", "bolt of fabric", "strip", "cm"},
                                            {"a timber yard", "board", "piece", "cm"}};
  const Theme& th = rng.pick(themes);
  const int m = size_for(rng, req.difficulty, 2, 3, 3, 4, 4, 5, 5, 6);
  const int width = rng.integer(10, 30) * 10;
  std::vector<int> w;
  while (static_cast<int>(w.size()) < m) {
    const int v = rng.integer(width / 6, width / 2);
    if (std::find(w.begin(), w.end(), v) == w.end()) w.push_back(v);
  }
  std::sort(w.rbegin(), w.rend());
  auto pats = maximal_patterns(w, width);
  Instance in;
  in.family = "cutting_stock";
  in.problem_class = "MILP";
  in.difficulty = req.difficulty;
  in.objective_unit = th.stock + "s";
  json& d = in.data;
  std::vector<std::string> I, P;
  for (int v : w) I.push_back(fmt::format("W{}", v));
  d["widths"] = I;
  d["roll_width"] = width;
  for (int k = 0; k < m; ++k) {
    d["width"][I[k]] = w[k];
    d["demand"][I[k]] = rng.integer(5, 80);
  }
  for (size_t p = 0; p < pats.size(); ++p) {
    P.push_back(fmt::format("P{}", p + 1));
    for (int k = 0; k < m; ++k)
      if (pats[p][k] > 0) d["pieces"][P.back()][I[k]] = pats[p][k];
  }
  d["patterns"] = P;
  in.story = fmt::format(
      fmt::runtime(rng.pick(std::vector<std::string>{
          "{firm_cap} cuts {stock}s {W} {unit} wide into narrower {piece}s to fill customer "
          "orders. Each {stock} is cut according to one cutting pattern; the leftover is scrap.",
          "Orders at {firm} call for {piece}s of {m} widths, all cut from standard {stock}s of "
          "width {W} {unit}. The planner has listed every efficient cutting pattern."})),
      fmt::arg("firm_cap", capitalize(th.firm)), fmt::arg("firm", th.firm), fmt::arg("stock", th.stock),
      fmt::arg("W", width), fmt::arg("unit", th.unit), fmt::arg("piece", th.piece), fmt::arg("m", m));
  std::string inl;
  std::vector<std::string> orders;
  for (int k = 0; k < m; ++k)
    orders.push_back(
        fmt::format("{} {}s of width {} {}", num(g(d["demand"][I[k]])), th.piece, w[k], th.unit));
  inl += "The orders are " + join_and(orders) + ". The cutting patterns are: ";
  std::vector<std::string> pd;
  for (size_t p = 0; p < pats.size(); ++p) {
    std::vector<std::string> parts;
    for (int k = 0; k < m; ++k)
      if (pats[p][k] > 0) parts.push_back(fmt::format("{} x {} {}", pats[p][k], w[k], th.unit));
    pd.push_back(fmt::format("{} = {}", P[p], join_and(parts)));
  }
  inl += join(pd, "; ") + ".";
  in.inline_data = inl;
  Table t1{"Orders:", {"Width (" + th.unit + ")", "Pieces ordered"}, {}};
  for (int k = 0; k < m; ++k) t1.rows.push_back({num(w[k]), num(g(d["demand"][I[k]]))});
  Table t2{"Cutting patterns (pieces of each width per " + th.stock + "):", {"Pattern"}, {}};
  for (int v : w) t2.header.push_back(fmt::format("{} {}", v, th.unit));
  for (size_t p = 0; p < pats.size(); ++p) {
    std::vector<std::string> row{P[p]};
    for (int k = 0; k < m; ++k) row.push_back(num(pats[p][k]));
    t2.rows.push_back(row);
  }
  in.tables = {t1, t2};
  in.table_lead = fmt::format("Stock {}s are {} {} wide.", th.stock, width, th.unit);
  in.question = fmt::format(
      "How many {}s should be cut with each pattern so that every order is filled (extra pieces "
      "are allowed) using the fewest {}s?",
      th.stock, th.stock);
  in.data_keys = {
      {"widths", "ordered widths (names)"},    {"width", "width of each ordered piece"},
      {"roll_width", "width of a stock roll"}, {"demand", "pieces ordered per width"},
      {"patterns", "cutting patterns"},        {"pieces", "pieces[pattern][width]: pieces cut (absent = 0)"}};
  ModelBuilder mb("cutting_stock", Sense::Minimize);
  std::vector<int> x;
  for (auto& p : P) {
    x.push_back(mb.integer("cut_" + p));
    mb.obj(x.back(), 1);
  }
  for (int k = 0; k < m; ++k) {
    const int r = mb.row("fill_" + I[k], RowSense::GE, g(d["demand"][I[k]]));
    for (size_t p = 0; p < pats.size(); ++p) mb.add(r, x[p], pats[p][k]);
  }
  in.model = mb.take();
  in.mathprog = R"(set widths; set patterns;
param roll_width; param width{widths}; param demand{widths}; param pieces{patterns, widths} default 0;
check{p in patterns}: sum{i in widths} pieces[p,i] * width[i] <= roll_width;
var cut{patterns} >= 0, integer;
minimize rolls: sum{p in patterns} cut[p];
s.t. fill{i in widths}: sum{p in patterns} pieces[p,i] * cut[p] >= demand[i];
)";
  in.formulation = R"(Sets:
- I: ordered widths; P: cutting patterns.
Parameters:
- a_(p,i): pieces of width i cut by pattern p; d_i: pieces ordered.
Decision variables:
- x_p >= 0 integer: stock rolls cut with pattern p.
Objective:
- minimize sum_p x_p
Constraints:
- demand: sum_p a_(p,i) * x_p >= d_i for every width i)";
  in.python_body = R"(I = data["widths"]
P = data["patterns"]
model = gp.Model("cutting_stock")
x = model.addVars(P, lb=0, ub=GRB.INFINITY, vtype=GRB.INTEGER, name="cut")
model.setObjective(x.sum(), GRB.MINIMIZE)
for i in I:
    model.addConstr(gp.quicksum(data["pieces"][p].get(i, 0) * x[p] for p in P) >= data["demand"][i], name=f"fill_{i}")
model.optimize()
)";
  in.reasoning = bullet_reasoning(
      fmt::format("Pattern-based cutting stock: {} widths, {} maximal patterns, roll width {}.", m,
                  pats.size(), width),
      {"Integer x_p = rolls cut with pattern p.", "Minimise the number of rolls.",
       "Each ordered width must be produced at least as often as ordered (over-production is allowed)."});
  return in;
}

}  // namespace

void add_cutting_families(std::vector<Family>& out) {
  out.push_back({"cutting_stock", "packing_cutting", false, false, &cutting_stock});
}

}  // namespace trex::orkit::gen
