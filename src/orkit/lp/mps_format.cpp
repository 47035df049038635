// MPS reader and writer (see mps_format.h).
#include "orkit/lp/mps_format.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/lp/text_input.h"

namespace trex::orkit {
namespace {

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  std::string f;
  while (in >> f) out.push_back(f);
  return out;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

class MpsParser {
 public:
  MpsParser(std::string_view text, std::string source) : text_(text), source_(std::move(source)) {}

  Model parse() {
    enum class Sec { None, Name, ObjSense, Rows, Columns, Rhs, Ranges, Bounds, QuadObj, QMatrix, End };
    Sec sec = Sec::None;
    size_t start = 0;
    while (start <= text_.size() && sec != Sec::End) {
      size_t end = text_.find('\n', start);
      if (end == std::string_view::npos) end = text_.size();
      std::string line(text_.substr(start, end - start));
      start = end + 1;
      ++line_;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '*') continue;
      const std::vector<std::string> f = split_fields(line);
      if (f.empty()) continue;
      if (!std::isspace(static_cast<unsigned char>(line[0]))) {
        const std::string head = upper(f[0]);
        if (head == "NAME") {
          model_.name = f.size() > 1 ? f[1] : "";
          sec = Sec::Name;
        } else if (head == "OBJSENSE") {
          sec = Sec::ObjSense;
          if (f.size() > 1) set_sense(f[1]);
        } else if (head == "ROWS") {
          sec = Sec::Rows;
        } else if (head == "COLUMNS") {
          sec = Sec::Columns;
        } else if (head == "RHS") {
          sec = Sec::Rhs;
        } else if (head == "RANGES") {
          sec = Sec::Ranges;
        } else if (head == "BOUNDS") {
          sec = Sec::Bounds;
        } else if (head == "QUADOBJ" || head == "QSECTION") {
          sec = Sec::QuadObj;
        } else if (head == "QMATRIX") {
          sec = Sec::QMatrix;
        } else if (head == "ENDATA") {
          sec = Sec::End;
        } else {
          error("section '{}' is not supported", f[0]);
        }
        continue;
      }
      switch (sec) {
        case Sec::ObjSense: set_sense(f[0]); break;
        case Sec::Rows: row_line(f); break;
        case Sec::Columns: column_line(f); break;
        case Sec::Rhs: rhs_line(f, false); break;
        case Sec::Ranges: rhs_line(f, true); break;
        case Sec::Bounds: bound_line(f); break;
        case Sec::QuadObj: quad_line(f, true); break;
        case Sec::QMatrix: quad_line(f, false); break;
        default: error("data line outside a section: '{}'", line);
      }
    }
    if (sec != Sec::End) fail("{}: missing ENDATA", source_);
    return finish();
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) const {
    fail("{}:{}: {}", source_, line_, fmt::format(f, std::forward<Args>(args)...));
  }

  double number(const std::string& s) const {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) error("expected a number, found '{}'", s);
    return v;
  }

  void set_sense(const std::string& s) {
    const std::string u = upper(s);
    if (u == "MAX" || u == "MAXIMIZE" || u == "MAXIMISE") model_.sense = Sense::Maximize;
    else if (u == "MIN" || u == "MINIMIZE" || u == "MINIMISE") model_.sense = Sense::Minimize;
    else error("expected MIN or MAX in OBJSENSE, found '{}'", s);
  }

  void row_line(const std::vector<std::string>& f) {
    if (f.size() < 2) error("expected '<type> <row name>' in ROWS");
    const std::string t = upper(f[0]);
    if (t == "N") {
      if (objective_.empty()) objective_ = f[1];
      else free_rows_.insert(f[1]);
      return;
    }
    Constraint r;
    r.name = f[1];
    if (t == "L") r.sense = RowSense::LE;
    else if (t == "G") r.sense = RowSense::GE;
    else if (t == "E") r.sense = RowSense::EQ;
    else error("row type must be N, L, G or E, found '{}'", f[0]);
    if (!rows_.emplace(r.name, static_cast<int>(model_.rows.size())).second) error("duplicate row '{}'", r.name);
    model_.rows.push_back(std::move(r));
  }

  int column(const std::string& name) {
    auto it = cols_.find(name);
    if (it != cols_.end()) return it->second;
    const int j = static_cast<int>(model_.vars.size());
    Variable v;
    v.name = name;
    v.type = in_int_ ? VarType::Integer : VarType::Continuous;
    model_.vars.push_back(v);
    cols_.emplace(name, j);
    return j;
  }

  void column_line(const std::vector<std::string>& f) {
    if (f.size() >= 3 && upper(f[1]) == "'MARKER'") {
      const std::string m = upper(f[2]);
      if (m == "'INTORG'") in_int_ = true;
      else if (m == "'INTEND'") in_int_ = false;
      else error("unknown marker '{}'", f[2]);
      return;
    }
    if (f.size() != 3 && f.size() != 5) error("expected '<column> <row> <value> [<row> <value>]' in COLUMNS");
    const int j = column(f[0]);
    for (size_t k = 1; k + 1 < f.size(); k += 2) {
      const double v = number(f[k + 1]);
      if (f[k] == objective_) {
        model_.objective.push_back({j, v});
      } else if (free_rows_.count(f[k])) {
        continue;
      } else {
        auto it = rows_.find(f[k]);
        if (it == rows_.end()) error("unknown row '{}'", f[k]);
        model_.rows[it->second].lin.push_back({j, v});
      }
    }
  }

  // RHS and RANGES: [set] (row value)+
  void rhs_line(const std::vector<std::string>& f, bool ranges) {
    const size_t first = f.size() % 2 == 1 ? 1 : 0;
    if (f.size() < 2) error("expected '[set] <row> <value>'");
    for (size_t k = first; k + 1 < f.size(); k += 2) {
      const double v = number(f[k + 1]);
      if (f[k] == objective_) {
        if (ranges) error("RANGES entry on the objective row");
        model_.objective_constant = -v;
        continue;
      }
      if (free_rows_.count(f[k])) continue;
      auto it = rows_.find(f[k]);
      if (it == rows_.end()) error("unknown row '{}'", f[k]);
      if (ranges) range_[it->second] = v;
      else model_.rows[it->second].rhs = v;
    }
  }

  void bound_line(const std::vector<std::string>& f) {
    if (f.size() < 2) error("expected '<type> [set] <column> [value]' in BOUNDS");
    const std::string t = upper(f[0]);
    const bool needs_value = t == "UP" || t == "LO" || t == "FX" || t == "LI" || t == "UI";
    const bool no_value = t == "FR" || t == "MI" || t == "PL" || t == "BV";
    if (!needs_value && !no_value) {
      if (t == "SC") error("semi-continuous bounds (SC) are not supported");
      error("unknown bound type '{}'", f[0]);
    }
    // Without a value: type [set] column; BV sometimes carries a value too.
    size_t col_at;
    if (needs_value) {
      if (f.size() != 3 && f.size() != 4) error("expected '{} [set] <column> <value>'", f[0]);
      col_at = f.size() == 4 ? 2 : 1;
    } else {
      col_at = f.size() >= 3 ? 2 : 1;
      if (t == "BV" && f.size() == 3 && cols_.count(f[1]) && !cols_.count(f[2])) col_at = 1;
    }
    auto it = cols_.find(f[col_at]);
    if (it == cols_.end()) error("bound on unknown column '{}'", f[col_at]);
    Variable& v = model_.vars[it->second];
    const double val = needs_value ? number(f[col_at + 1]) : 0.0;
    if (t == "UP" || t == "UI") {
      v.ub = val;
      if (val < 0 && v.lb == 0.0 && !lb_set_.count(it->second)) v.lb = -kInf;
      if (t == "UI") v.type = VarType::Integer;
    } else if (t == "LO" || t == "LI") {
      v.lb = val;
      lb_set_.insert(it->second);
      if (t == "LI") v.type = VarType::Integer;
    } else if (t == "FX") {
      v.lb = v.ub = val;
      lb_set_.insert(it->second);
    } else if (t == "FR") {
      v.lb = -kInf;
      v.ub = kInf;
    } else if (t == "MI") {
      v.lb = -kInf;
      lb_set_.insert(it->second);
    } else if (t == "PL") {
      v.ub = kInf;
    } else if (t == "BV") {
      v.type = VarType::Binary;
      v.lb = 0.0;
      v.ub = 1.0;
    }
  }

  void quad_line(const std::vector<std::string>& f, bool lower_triangle) {
    if (f.size() != 3) error("expected '<column> <column> <value>'");
    auto a = cols_.find(f[0]), b = cols_.find(f[1]);
    if (a == cols_.end() || b == cols_.end()) error("quadratic entry on an unknown column");
    const double q = number(f[2]);
    int i = a->second, j = b->second;
    // Objective 0.5 x'Qx: a diagonal entry gives 0.5 Q_ii x_i^2; an off-diagonal entry listed once
    // (QUADOBJ, lower triangle) gives Q_ij x_i x_j, listed twice (QMATRIX) 0.5 Q_ij each time.
    const double coef = i == j ? 0.5 * q : (lower_triangle ? q : 0.5 * q);
    model_.objective_quad.push_back({std::min(i, j), std::max(i, j), coef});
  }

  Model finish() {
    if (objective_.empty() && model_.rows.empty() && model_.vars.empty()) fail("{}: no ROWS/COLUMNS found", source_);
    fold_constant_column();
    merge_duplicate_terms(model_.objective);
    merge_duplicate_terms(model_.objective_quad);
    for (auto& r : model_.rows) merge_duplicate_terms(r.lin);
    if (range_.empty()) return std::move(model_);
    std::vector<Constraint> rows;
    for (size_t i = 0; i < model_.rows.size(); ++i) {
      Constraint r = std::move(model_.rows[i]);
      auto it = range_.find(static_cast<int>(i));
      if (it == range_.end()) {
        rows.push_back(std::move(r));
        continue;
      }
      const double R = it->second;
      double lo, hi;
      if (r.sense == RowSense::EQ) lo = R >= 0 ? r.rhs : r.rhs + R, hi = R >= 0 ? r.rhs + R : r.rhs;
      else if (r.sense == RowSense::LE) lo = r.rhs - std::abs(R), hi = r.rhs;
      else lo = r.rhs, hi = r.rhs + std::abs(R);
      if (lo == hi) {
        r.sense = RowSense::EQ;
        r.rhs = lo;
        rows.push_back(std::move(r));
        continue;
      }
      Constraint up = r;
      r.sense = RowSense::GE;
      r.rhs = lo;
      up.name += "_hi";
      up.sense = RowSense::LE;
      up.rhs = hi;
      rows.push_back(std::move(r));
      rows.push_back(std::move(up));
    }
    model_.rows = std::move(rows);
    return std::move(model_);
  }

  void fold_constant_column() {
    auto it = cols_.find("Constant");
    if (it == cols_.end()) return;
    const int k = it->second;
    const Variable& v = model_.vars[k];
    if (v.type != VarType::Continuous || v.lb != v.ub || !std::isfinite(v.lb)) return;
    for (const auto& r : model_.rows)
      for (const auto& t : r.lin)
        if (t.var == k) return;
    for (const auto& q : model_.objective_quad)
      if (q.i == k || q.j == k) return;
    std::vector<LinTerm> objective;
    for (const auto& t : model_.objective) {
      if (t.var == k) model_.objective_constant += t.coef * v.lb;
      else objective.push_back({t.var > k ? t.var - 1 : t.var, t.coef});
    }
    model_.objective = std::move(objective);
    for (auto& q : model_.objective_quad) q.i -= q.i > k, q.j -= q.j > k;
    for (auto& r : model_.rows)
      for (auto& t : r.lin) t.var -= t.var > k;
    model_.vars.erase(model_.vars.begin() + k);
  }

  std::string_view text_;
  std::string source_;
  int line_ = 0;
  Model model_;
  std::string objective_;
  std::unordered_set<std::string> free_rows_;
  std::unordered_map<std::string, int> rows_, cols_;
  std::unordered_map<int, double> range_;
  std::unordered_set<int> lb_set_;
  bool in_int_ = false;
};

std::string mps_name(const std::string& name, std::unordered_set<std::string>& used, const char* fallback) {
  std::string s = name.empty() ? fallback : name;
  for (auto& c : s)
    if (std::isspace(static_cast<unsigned char>(c)) || c == '$' || c == '*') c = '_';
  if (!used.insert(s).second) {
    for (int k = 1;; ++k) {
      std::string alt = s + "_" + std::to_string(k);
      if (used.insert(alt).second) return alt;
    }
  }
  return s;
}

}  // namespace

Model read_mps(std::string_view text, const std::string& source_name) {
  require_text(text, source_name, "MPS file");
  return MpsParser(text, source_name).parse();
}

Model read_mps_file(const std::filesystem::path& path) {
  Model m = read_mps(read_text_file(path), path.string());
  if (m.name.empty()) m.name = path.stem().string();
  return m;
}

std::string write_mps(const Model& input, const MpsWriteOptions& opts) {
  const bool negate = input.sense == Sense::Maximize && !opts.objsense_section;
  Model negated;
  if (negate) {
    negated = input;
    negated.sense = Sense::Minimize;
    negated.objective_constant = -negated.objective_constant;
    for (auto& t : negated.objective) t.coef = -t.coef;
    for (auto& q : negated.objective_quad) q.coef = -q.coef;
  }
  const Model& model = negate ? negated : input;
  for (const auto& r : model.rows)
    TREX_CHECK(r.quad.empty(), "write_mps: row '{}' is quadratic (MPS output supports quadratic objectives only)",
               r.name);
  std::unordered_set<std::string> used_rows, used_cols;
  std::vector<std::string> rn, cn;
  for (size_t i = 0; i < model.rows.size(); ++i) rn.push_back(mps_name(model.rows[i].name, used_rows, "R"));
  const std::string obj = mps_name("OBJ", used_rows, "OBJ");
  for (const auto& v : model.vars) cn.push_back(mps_name(v.name, used_cols, "x"));

  const size_t n = model.vars.size();
  std::vector<std::vector<std::pair<int, double>>> cols(n);  // (row or -1 for objective, value)
  {
    std::vector<LinTerm> objective = model.objective;
    merge_duplicate_terms(objective);
    for (const auto& t : objective) cols[t.var].push_back({-1, t.coef});
  }
  for (size_t i = 0; i < model.rows.size(); ++i) {
    std::vector<LinTerm> lin = model.rows[i].lin;
    merge_duplicate_terms(lin);
    for (const auto& t : lin) cols[t.var].push_back({static_cast<int>(i), t.coef});
  }
  std::unordered_set<std::string> problem_name;
  std::string out = "NAME " + mps_name(model.name, problem_name, "trex") + "\n";
  if (negate) out += "* Maximisation written as: minimize the negated objective\n";
  if (model.sense == Sense::Maximize) out += "OBJSENSE\n    MAX\n";
  out += "ROWS\n N  " + obj + "\n";
  for (size_t i = 0; i < model.rows.size(); ++i) {
    const RowSense s = model.rows[i].sense;
    out += std::string(" ") + (s == RowSense::LE ? "L" : s == RowSense::GE ? "G" : "E") + "  " + rn[i] + "\n";
  }
  out += "COLUMNS\n";
  bool in_int = false;
  for (size_t j = 0; j < n; ++j) {
    const bool is_int = model.vars[j].type != VarType::Continuous;
    if (is_int != in_int) {
      out += std::string("    MARKER  'MARKER'  ") + (is_int ? "'INTORG'" : "'INTEND'") + "\n";
      in_int = is_int;
    }
    if (cols[j].empty()) out += "    " + cn[j] + "  " + obj + "  0\n";
    for (const auto& [row, v] : cols[j])
      out += "    " + cn[j] + "  " + (row < 0 ? obj : rn[row]) + "  " + format_number(v) + "\n";
  }
  if (in_int) out += "    MARKER  'MARKER'  'INTEND'\n";
  std::string constant_col;
  if (model.objective_constant != 0.0 && opts.constant_as_variable) {
    constant_col = mps_name("Constant", used_cols, "Constant");
    out += "    " + constant_col + "  " + obj + "  " + format_number(model.objective_constant) + "\n";
  }
  out += "RHS\n";
  for (size_t i = 0; i < model.rows.size(); ++i) {
    const double rhs = model.rows[i].rhs;
    TREX_CHECK(std::isfinite(rhs), "write_mps: row '{}' has an infinite right-hand side", model.rows[i].name);
    if (rhs != 0.0) out += "    RHS  " + rn[i] + "  " + format_number(rhs) + "\n";
  }
  if (model.objective_constant != 0.0 && !opts.constant_as_variable)
    out += "    RHS  " + obj + "  " + format_number(-model.objective_constant) + "\n";
  out += "BOUNDS\n";
  for (size_t j = 0; j < n; ++j) {
    const Variable& v = model.vars[j];
    const std::string& c = cn[j];
    if (v.type == VarType::Binary && v.lb == 0.0 && v.ub == 1.0) {
      out += " BV BND  " + c + "\n";
      continue;
    }
    double lb = v.lb, ub = v.ub;
    if (v.type == VarType::Binary) lb = std::max(lb, 0.0), ub = std::min(ub, 1.0);
    if (lb == -kInf && ub == kInf) {
      out += " FR BND  " + c + "\n";
    } else if (lb == ub) {
      out += " FX BND  " + c + "  " + format_number(lb) + "\n";
    } else {
      // UP before LO/MI: readers that turn a negative UP into lb = -inf see the explicit LO after it.
      if (ub != kInf) out += " UP BND  " + c + "  " + format_number(ub) + "\n";
      else if (v.type != VarType::Continuous) out += " PL BND  " + c + "\n";
      if (lb == -kInf) out += " MI BND  " + c + "\n";
      else if (lb != 0.0 || ub < 0.0) out += " LO BND  " + c + "  " + format_number(lb) + "\n";
    }
  }
  if (!constant_col.empty()) out += " FX BND  " + constant_col + "  1\n";
  if (!model.objective_quad.empty()) {
    // 0.5 x'Qx = sum q x_i x_j: Q_ii = 2 q_ii, Q_ij = q_ij (lower triangle, listed once).
    std::vector<QuadTerm> q = model.objective_quad;
    merge_duplicate_terms(q);
    out += "QUADOBJ\n";
    for (const auto& t : q)
      out += "    " + cn[t.i] + "  " + cn[t.j] + "  " + format_number(t.i == t.j ? 2.0 * t.coef : t.coef) + "\n";
  }
  out += "ENDATA\n";
  return out;
}

void write_mps_file(const Model& model, const std::filesystem::path& path, const MpsWriteOptions& opts) {
  write_text_atomic(path, write_mps(model, opts));
}

}  // namespace trex::orkit
