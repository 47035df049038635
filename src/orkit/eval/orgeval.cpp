#include "orkit/eval/orgeval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <unordered_map>
#include <vector>

namespace trex::orkit::eval {

namespace {

// One linear row after normalisation (quadratic rows are dropped: ORGEval only sees linear constraints).
struct NormRow {
  std::vector<LinTerm> lin;
  RowSense sense;
  double rhs;
};

struct NormModel {
  std::vector<double> obj, lb, ub;
  std::vector<int> type;  // 1 binary, 2 integer, 0 otherwise
  std::vector<NormRow> rows;
};

NormModel normalise(const Model& m) {
  const size_t n = m.vars.size();
  NormModel out;
  out.obj.assign(n, 0.0);
  for (const auto& t : m.objective) out.obj[t.var] += t.coef;
  out.lb.resize(n), out.ub.resize(n), out.type.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& v = m.vars[i];
    out.type[i] = v.type == VarType::Binary ? 1 : v.type == VarType::Integer ? 2 : 0;
    out.lb[i] = v.lb;
    out.ub[i] = v.ub;
  }
  // Single-variable rows -> bound candidates; as in the reference, the sense is not flipped for a negative
  // coefficient and the combined candidate replaces the declared bound.
  std::map<int, double> new_lb, new_ub;
  for (const auto& r : m.rows) {
    if (!r.quad.empty()) continue;
    std::vector<LinTerm> lin(r.lin);
    // duplicate terms are merged as a file round trip would
    std::map<int, double> merged;
    std::vector<int> order;
    for (const auto& t : lin) {
      if (!merged.count(t.var)) order.push_back(t.var);
      merged[t.var] += t.coef;
    }
    lin.clear();
    for (int v : order) lin.push_back({v, merged[v]});
    int nonzero = 0, which = -1;
    double coef = 0.0;
    for (const auto& t : lin)
      if (std::fabs(t.coef) >= 1e-12) ++nonzero, which = t.var, coef = t.coef;
    if (nonzero == 1) {
      const double b = r.rhs / coef;
      if (r.sense == RowSense::GE || r.sense == RowSense::EQ)
        new_lb[which] = new_lb.count(which) ? std::max(new_lb[which], b) : b;
      if (r.sense == RowSense::LE || r.sense == RowSense::EQ)
        new_ub[which] = new_ub.count(which) ? std::min(new_ub[which], b) : b;
      continue;
    }
    NormRow nr{lin, r.sense, r.rhs};
    if (nr.sense == RowSense::LE && std::fabs(nr.rhs) < 1e-9) {
      for (auto& t : nr.lin) t.coef = -t.coef;
      nr.sense = RowSense::GE;
      nr.rhs = 0.0;
    } else if (nr.sense == RowSense::EQ && std::fabs(nr.rhs) < 1e-9) {
      double sum = 0.0;
      for (const auto& t : nr.lin) sum += t.coef;
      if (std::fabs(sum) >= 1e-12 && sum < 0) {
        for (auto& t : nr.lin) t.coef = -t.coef;
        nr.rhs = 0.0;
      }
    }
    out.rows.push_back(std::move(nr));
  }
  for (auto& [v, b] : new_lb) out.lb[v] = b;
  for (auto& [v, b] : new_ub) out.ub[v] = b;
  return out;
}

// float32, then "%.6f": the reference's tolerance (infinities print as inf, tiny values keep their sign).
std::string q(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", double(float(x)));
  return buf;
}

// Colours are interned strings shared by both graphs, so equal ids <=> equal colours (an exact hash).
struct Interner {
  std::unordered_map<std::string, int> ids;
  int get(const std::string& s) {
    auto [it, fresh] = ids.emplace(s, int(ids.size()));
    return it->second;
  }
};

struct Graph {
  int num_nodes = 0;
  std::vector<std::vector<std::pair<int, std::string>>> adj;  // neighbour, edge colour
  std::vector<std::string> feature;
};

Graph build_graph(const NormModel& m) {
  Graph g;
  const int nv = int(m.obj.size()), nr = int(m.rows.size());
  g.num_nodes = nv + nr;
  g.adj.resize(g.num_nodes);
  g.feature.resize(g.num_nodes);
  for (int i = 0; i < nv; ++i)
    g.feature[i] = q(m.obj[i]) + "," + std::to_string(m.type[i]) + "," + q(m.lb[i]) + "," + q(m.ub[i]);
  for (int r = 0; r < nr; ++r) {
    const auto& row = m.rows[r];
    const int code = row.sense == RowSense::EQ ? 0 : row.sense == RowSense::LE ? -1 : 1;
    g.feature[nv + r] = q(row.rhs) + "," + std::to_string(code);
    for (const auto& t : row.lin) {
      if (t.coef == 0.0) continue;  // not a nonzero
      const std::string e = q(t.coef);
      g.adj[nv + r].push_back({t.var, e});
      g.adj[t.var].push_back({nv + r, e});
    }
  }
  return g;
}

// Refines until the number of distinct colours stops growing; returns the last round's colours.
std::vector<int> wl_refine(const Graph& g, Interner& in, int& rounds) {
  std::vector<int> colour(g.num_nodes);
  for (int i = 0; i < g.num_nodes; ++i) colour[i] = in.get("F" + g.feature[i]);
  size_t prev_count = 0;
  rounds = 0;
  for (int it = 0; it < std::max(1, g.num_nodes); ++it) {
    std::vector<int> next(g.num_nodes);
    std::vector<std::string> parts;
    for (int i = 0; i < g.num_nodes; ++i) {
      parts.clear();
      for (const auto& [nb, e] : g.adj[i]) parts.push_back(std::to_string(colour[nb]) + "|" + e);
      std::sort(parts.begin(), parts.end());
      std::string s = "W" + std::to_string(colour[i]);
      for (const auto& p : parts) s += "|" + p;
      next[i] = in.get(s);
    }
    colour.swap(next);
    ++rounds;
    const size_t count = std::set<int>(colour.begin(), colour.end()).size();
    if (count <= prev_count) break;
    prev_count = count;
  }
  return colour;
}

// The sufficient condition: every colour class is a singleton, or, in the subgraph induced on nodes of
// non-singleton classes, no connected component holds two nodes of the same class.
bool certifiable(const Graph& g, const std::vector<int>& colour) {
  std::unordered_map<int, int> class_size;
  for (int c : colour) ++class_size[c];
  std::vector<char> in_sub(g.num_nodes, 0);
  bool all_single = true;
  for (int i = 0; i < g.num_nodes; ++i)
    if (class_size[colour[i]] > 1) in_sub[i] = 1, all_single = false;
  if (all_single) return true;
  std::vector<int> comp(g.num_nodes, -1);
  for (int s = 0; s < g.num_nodes; ++s) {
    if (!in_sub[s] || comp[s] >= 0) continue;
    std::vector<int> stack{s};
    comp[s] = s;
    std::set<int> seen_classes;
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      if (!seen_classes.insert(colour[u]).second) return false;
      for (const auto& [v, e] : g.adj[u])
        if (in_sub[v] && comp[v] < 0) comp[v] = s, stack.push_back(v);
    }
  }
  return true;
}

}  // namespace

EquivalenceVerdict check_lp_equivalence(const Model& reference, const Model& candidate) {
  EquivalenceVerdict v;
  const NormModel a = normalise(reference), b = normalise(candidate);
  v.reference_vars = int(a.obj.size());
  v.candidate_vars = int(b.obj.size());
  v.reference_rows = int(a.rows.size());
  v.candidate_rows = int(b.rows.size());
  if (v.reference_vars != v.candidate_vars) {
    v.reason = "var_count_mismatch";
    return v;
  }
  if (v.reference_rows != v.candidate_rows) {
    v.reason = "constraint_count_mismatch";
    return v;
  }
  const Graph ga = build_graph(a), gb = build_graph(b);
  Interner in;
  const auto ca = wl_refine(ga, in, v.wl_rounds_reference);
  const auto cb = wl_refine(gb, in, v.wl_rounds_candidate);
  if (std::set<int>(ca.begin(), ca.end()) != std::set<int>(cb.begin(), cb.end())) {
    v.reason = "wl_graph_mismatch";
    return v;
  }
  if (!certifiable(ga, ca)) {
    v.reason = "reference_not_certifiable";
    return v;
  }
  if (!certifiable(gb, cb)) {
    v.reason = "candidate_not_certifiable";
    return v;
  }
  v.equivalent = true;
  v.reason = "equivalent";
  return v;
}

}  // namespace trex::orkit::eval
