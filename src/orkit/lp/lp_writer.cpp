// CPLEX LP writer. Output is canonical: `obj:` names the objective, every row is named, numbers are the
// shortest decimal that reads back bit-exactly, lines wrap before ~100 columns but a relation and its
// right-hand side always stay on the line of the last term (the reader relies on that).
#include <charconv>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"

namespace trex::orkit {

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return "0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

namespace {

constexpr size_t kWrapColumn = 100;

bool is_keyword(const std::string& name) {
  static const char* kWords[] = {"minimize", "minimum", "min", "minimise", "maximize", "maximum", "max",
                                 "maximise", "subject", "such", "st", "s.t.", "st.", "bounds", "bound",
                                 "general", "generals", "gen", "integers", "binary", "binaries", "bin",
                                 "semi", "semis", "semi-continuous", "sos", "end", "free", "inf",
                                 "infinity", "lazy", "user", "pwlobj"};
  std::string l = name;
  for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* w : kWords)
    if (l == w) return true;
  return false;
}

// A name the LP readers accept (see LpWriteOptions::portable_names).
std::string clean_name(const std::string& name, bool portable) {
  std::string out;
  int depth = 0;
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (portable) {
      if (c == '[') c = '(';
      else if (c == ']') c = ')';
      else if (!std::isalnum(u) && !std::strchr("!\"#$%&()/,.;?@_`'{}|~", c)) c = '_';
    } else {
      if (u <= ' ' || u >= 127 || std::strchr("+-*^<>=:\\", c)) c = '_';
      if (c == '[') ++depth;
      if (c == ']') {
        if (depth == 0) c = '_';
        else --depth;
      }
    }
    out += c;
  }
  // An unclosed '[' would swallow the following ']' of a quadratic block.
  if (!portable && depth > 0)
    for (auto& c : out)
      if (c == '[') c = '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0])) || out[0] == '.' || out[0] == '[' ||
      out[0] == ']' || out[0] == '/' || is_keyword(out) ||
      ((out[0] == 'e' || out[0] == 'E') && out.size() > 1 && std::isdigit(static_cast<unsigned char>(out[1]))))
    out = "_" + out;
  return out;
}

std::vector<std::string> unique_names(const std::vector<std::string>& names, bool portable,
                                      std::unordered_set<std::string>& used) {
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const auto& n : names) {
    std::string c = clean_name(n, portable);
    if (!used.insert(c).second) {
      for (int k = 1;; ++k) {
        std::string alt = c + "_" + std::to_string(k);
        if (used.insert(alt).second) {
          c = std::move(alt);
          break;
        }
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

// Accumulates `+ 3 x - y ...` with wrapping.
class LineBuilder {
 public:
  explicit LineBuilder(std::string& out) : out_(out) {}
  void start(const std::string& prefix) {
    line_ = prefix;
    first_ = true;
  }
  void term(double coef, const std::string& body, bool show_unit_coef = false) {
    std::string piece;
    const bool neg = std::signbit(coef);
    const double a = std::abs(coef);
    if (first_) {
      if (neg) piece += "- ";
    } else {
      piece += neg ? " - " : " + ";
    }
    if (a != 1.0 || show_unit_coef || body.empty()) {
      piece += format_number(a);
      if (!body.empty()) piece += ' ';
    }
    piece += body;
    raw(piece);
  }
  void raw(const std::string& piece) {
    if (line_.size() + piece.size() > kWrapColumn && !first_) {
      out_ += line_;
      out_ += '\n';
      line_ = "  ";
    }
    line_ += piece;
    first_ = false;
  }
  bool empty() const { return first_; }
  void finish(const std::string& tail = "") {
    out_ += line_;
    out_ += tail;
    out_ += '\n';
  }

 private:
  std::string& out_;
  std::string line_;
  bool first_ = true;
};

const char* rel_text(RowSense s) { return s == RowSense::LE ? "<=" : s == RowSense::GE ? ">=" : "="; }

}  // namespace

std::string write_lp(const Model& model, const LpWriteOptions& opts) {
  const size_t n = model.vars.size();
  for (size_t j = 0; j < n; ++j) {
    const auto& v = model.vars[j];
    TREX_CHECK(!std::isnan(v.lb) && !std::isnan(v.ub), "write_lp: variable '{}' has a NaN bound", v.name);
  }
  std::unordered_set<std::string> used_vars, used_rows;
  std::vector<std::string> var_src, row_src;
  for (const auto& v : model.vars) var_src.push_back(v.name.empty() ? "x" : v.name);
  for (size_t i = 0; i < model.rows.size(); ++i)
    row_src.push_back(model.rows[i].name.empty() ? "R" + std::to_string(i) : model.rows[i].name);
  const std::vector<std::string> vn = unique_names(var_src, opts.portable_names, used_vars);
  const std::vector<std::string> rn = unique_names(row_src, opts.portable_names, used_rows);
  std::string constant_name;
  const bool constant_var = model.objective_constant != 0.0 && opts.constant_as_variable;
  if (constant_var) {
    TREX_CHECK(std::isfinite(model.objective_constant), "write_lp: objective constant is {}",
               model.objective_constant);
    constant_name = "Constant";
    for (int k = 1; used_vars.count(constant_name); ++k) constant_name = "Constant_" + std::to_string(k);
  }

  auto quad_body = [&](const QuadTerm& q) {
    return q.i == q.j ? vn[q.i] + " ^ 2" : vn[q.i] + " * " + vn[q.j];
  };

  std::string out;
  out += "\\ Model " + (model.name.empty() ? std::string("trex") : model.name) + "\n";
  out += "\\ Written by trex (CPLEX LP format)\n";
  out += model.sense == Sense::Minimize ? "Minimize\n" : "Maximize\n";
  LineBuilder lb(out);
  lb.start(" obj: ");
  for (const auto& t : model.objective) lb.term(t.coef, vn[t.var]);
  if (!model.objective_quad.empty()) {
    lb.raw(lb.empty() ? "[ " : " + [ ");
    bool first = true;
    for (const auto& q : model.objective_quad) {
      // The LP objective's brackets are halved: write 2q so that `[ ... ] / 2` equals q.
      const double c = 2.0 * q.coef;
      std::string piece = first ? (std::signbit(c) ? "- " : "") : (std::signbit(c) ? " - " : " + ");
      piece += format_number(std::abs(c)) + " " + quad_body(q);
      lb.raw(piece);
      first = false;
    }
    lb.raw(" ] / 2");
  }
  if (model.objective_constant != 0.0) {
    if (constant_var) {
      lb.term(model.objective_constant, constant_name, true);
    } else {
      lb.term(model.objective_constant, "");
    }
  }
  lb.finish();

  out += "Subject To\n";
  for (size_t i = 0; i < model.rows.size(); ++i) {
    const Constraint& r = model.rows[i];
    lb.start(" " + rn[i] + ": ");
    for (const auto& t : r.lin) {
      TREX_CHECK(t.var >= 0 && static_cast<size_t>(t.var) < n, "write_lp: row '{}' uses variable index {}",
                 r.name, t.var);
      lb.term(t.coef, vn[t.var]);
    }
    if (!r.quad.empty()) {
      lb.raw(lb.empty() ? "[ " : " + [ ");
      bool first = true;
      for (const auto& q : r.quad) {
        std::string piece = first ? (std::signbit(q.coef) ? "- " : "") : (std::signbit(q.coef) ? " - " : " + ");
        piece += format_number(std::abs(q.coef)) + " " + quad_body(q);
        lb.raw(piece);
        first = false;
      }
      lb.raw(" ]");
    }
    if (lb.empty()) {
      // An empty row still needs a variable for the readers.
      TREX_CHECK(n > 0, "write_lp: row '{}' has no terms and the model has no variables", r.name);
      lb.term(0.0, vn[0], true);
    }
    lb.finish(std::string(" ") + rel_text(r.sense) + " " +
              (std::isinf(r.rhs) ? (r.rhs > 0 ? "+inf" : "-inf") : format_number(r.rhs)));
  }

  // A variable that appears nowhere else is declared in Bounds, so that reading the file back gives
  // the same number of variables.
  std::vector<char> used(n, 0);
  for (const auto& t : model.objective) used[t.var] = 1;
  for (const auto& q : model.objective_quad) used[q.i] = used[q.j] = 1;
  for (const auto& r : model.rows) {
    for (const auto& t : r.lin) used[t.var] = 1;
    for (const auto& q : r.quad) used[q.i] = used[q.j] = 1;
  }
  for (const auto& r : model.rows)
    if (r.lin.empty() && r.quad.empty() && n > 0) used[0] = 1;  // written as `0 v0`
  std::string bounds;
  for (size_t j = 0; j < n; ++j) {
    const Variable& v = model.vars[j];
    const std::string& name = vn[j];
    const double def_ub = v.type == VarType::Binary ? 1.0 : kInf;
    if (v.lb == 0.0 && v.ub == def_ub) {
      if (!used[j] && v.type == VarType::Continuous) bounds += " " + name + " >= 0\n";
      continue;
    }
    if (v.lb == -kInf && v.ub == kInf) {
      bounds += " " + name + " free\n";
    } else if (v.lb == v.ub) {
      bounds += " " + name + " = " + format_number(v.lb) + "\n";
    } else if (v.lb == 0.0 && v.ub >= 0.0) {
      bounds += " " + name + " <= " + format_number(v.ub) + "\n";
    } else if (v.ub == kInf) {
      bounds += " " + name + " >= " + format_number(v.lb) + "\n";
    } else {
      bounds += " " + format_number(v.lb) + " <= " + name + " <= " + format_number(v.ub) + "\n";
    }
  }
  if (constant_var) bounds += " " + constant_name + " = 1\n";
  if (!bounds.empty()) out += "Bounds\n" + bounds;
  std::string generals, binaries;
  for (size_t j = 0; j < n; ++j) {
    if (model.vars[j].type == VarType::Integer) generals += " " + vn[j] + "\n";
    if (model.vars[j].type == VarType::Binary) binaries += " " + vn[j] + "\n";
  }
  if (!generals.empty()) out += "Generals\n" + generals;
  if (!binaries.empty()) out += "Binaries\n" + binaries;
  out += "End\n";
  return out;
}

void write_lp_file(const Model& model, const std::filesystem::path& path, const LpWriteOptions& opts) {
  write_text_atomic(path, write_lp(model, opts));
}

}  // namespace trex::orkit
