// CPLEX LP reader (see lp_format.h for the accepted language). A tokenizer turns the whole text into
// tokens that remember their line and whether they start it; section keywords are only recognised at
// the start of a line, which is what makes names such as `bin` or `free` usable elsewhere.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/lp/text_input.h"

namespace trex::orkit {
namespace {

enum class Tk { Name, Number, Plus, Minus, Star, Caret, Slash, LBracket, RBracket, Colon, Rel, Arrow };

struct Token {
  Tk kind;
  std::string text;
  double value = 0.0;
  RowSense rel = RowSense::LE;
  int line = 0;
  bool line_start = false;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// strchr also finds the terminating '\0', so NUL is tested apart (require_text rejects it before).
bool ends_name(char c) {
  return c == '\0' || std::isspace(static_cast<unsigned char>(c)) || std::strchr("+-*^<>=:\\", c) != nullptr;
}

std::vector<Token> tokenize(std::string_view s, const std::string& source) {
  std::vector<Token> out;
  int line = 1;
  bool line_start = true;
  size_t i = 0;
  auto push = [&](Tk kind, std::string text) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.line = line;
    t.line_start = line_start;
    line_start = false;
    out.push_back(std::move(t));
    return &out.back();
  };
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\n') {
      ++line;
      line_start = true;
      ++i;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (c == '\\') {
      if (i + 1 < s.size() && s[i + 1] == '*') {  // block comment \* ... *\   .
        const size_t end = s.find("*\\", i + 2);
        if (end == std::string_view::npos) fail("{}:{}: unterminated comment '\\*'", source, line);
        line += static_cast<int>(std::count(s.begin() + i, s.begin() + end, '\n'));
        i = end + 2;
      } else {
        while (i < s.size() && s[i] != '\n') ++i;
      }
      continue;
    }
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    switch (c) {
      case '+': push(Tk::Plus, "+"), ++i; continue;
      case '-':
        if (next == '>') {
          push(Tk::Arrow, "->"), i += 2;
        } else {
          push(Tk::Minus, "-"), ++i;
        }
        continue;
      case '*': push(Tk::Star, "*"), ++i; continue;
      case '^': push(Tk::Caret, "^"), ++i; continue;
      case '/': push(Tk::Slash, "/"), ++i; continue;
      case '[': push(Tk::LBracket, "["), ++i; continue;
      case ']': push(Tk::RBracket, "]"), ++i; continue;
      case ':': push(Tk::Colon, ":"), ++i; continue;
      case '<':
      case '>':
      case '=': {
        std::string text(1, c);
        RowSense rel = c == '<' ? RowSense::LE : c == '>' ? RowSense::GE : RowSense::EQ;
        if (c == '<' && next == '-') {
          push(Tk::Arrow, "<-"), i += 2;
          continue;
        }
        if (next == '=' && c != '=') {
          text += next;
        } else if (c == '=' && (next == '<' || next == '>' || next == '=')) {
          text += next;
          rel = next == '<' ? RowSense::LE : next == '>' ? RowSense::GE : RowSense::EQ;
        }
        i += text.size();
        push(Tk::Rel, text)->rel = rel;
        continue;
      }
      default: break;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && std::isdigit(static_cast<unsigned char>(next)))) {
      size_t j = i;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.')) ++j;
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
          j = k;
        }
      }
      std::string text(s.substr(i, j - i));
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end != text.c_str() + text.size()) fail("{}:{}: malformed number '{}'", source, line, text);
      push(Tk::Number, text)->value = v;
      i = j;
      continue;
    }
    // A name: brackets inside it (Gurobi's x[0], x[1,2]) belong to it while they balance.
    size_t j = i;
    int depth = 0;
    while (j < s.size() && !ends_name(s[j])) {
      if (s[j] == '[') ++depth;
      if (s[j] == ']') {
        if (depth == 0) break;
        --depth;
      }
      ++j;
    }
    // Every character that cannot start a name was handled above; a zero-length name would not advance.
    if (j == i) fail("{}:{}: unexpected character 0x{:02x}", source, line, static_cast<unsigned char>(s[i]));
    push(Tk::Name, std::string(s.substr(i, j - i)));
    i = j;
  }
  return out;
}

enum class Section { None, Min, Max, Constraints, Bounds, Generals, Binaries, Semi, Sos, Unsupported, End };

class LpParser {
 public:
  LpParser(std::string_view text, const std::string& source, const LpReadOptions& opts)
      : source_(source), opts_(opts), toks_(tokenize(text, source)) {}

  Model parse() {
    if (toks_.empty()) fail("{}: empty LP file: expected 'Minimize' or 'Maximize'", source_);
    int used = 0;
    Section sec = section_at(0, &used);
    if (sec != Section::Min && sec != Section::Max)
      error(0, "expected 'Minimize' or 'Maximize' to start the LP, found {}", describe(0));
    while (sec != Section::End) {
      const size_t keyword = pos_;
      pos_ += used;
      switch (sec) {
        case Section::Min:
        case Section::Max:
          if (seen_objective_) error(keyword, "a second objective section (only one objective is supported)");
          seen_objective_ = true;
          model_.sense = sec == Section::Min ? Sense::Minimize : Sense::Maximize;
          parse_objective();
          break;
        case Section::Constraints: parse_constraints(); break;
        case Section::Bounds: parse_bounds(); break;
        case Section::Generals: parse_type_list(VarType::Integer); break;
        case Section::Binaries: parse_type_list(VarType::Binary); break;
        case Section::Semi: error(keyword, "semi-continuous variables are not supported");
        case Section::Sos: error(keyword, "SOS constraints are not supported");
        case Section::Unsupported: error(keyword, "section '{}' is not supported", toks_[keyword].text);
        default: error(keyword, "unexpected {}", describe(keyword));
      }
      if (pos_ >= toks_.size()) break;  // `End` is optional
      sec = section_at(pos_, &used);
      if (sec == Section::None) error(pos_, "unexpected {}", describe(pos_));
    }
    finish();
    return std::move(model_);
  }

 private:
  struct Expr {
    std::vector<LinTerm> lin;
    std::vector<QuadTerm> quad;
    double constant = 0.0;
    bool any_term = false;
  };

  template <typename... Args>
  [[noreturn]] void error(size_t at, fmt::format_string<Args...> f, Args&&... args) const {
    const int line = at < toks_.size() ? toks_[at].line : (toks_.empty() ? 1 : toks_.back().line);
    fail("{}:{}: {}", source_, line, fmt::format(f, std::forward<Args>(args)...));
  }

  std::string describe(size_t at) const {
    if (at >= toks_.size()) return "end of file";
    return "'" + toks_[at].text + "'";
  }

  bool is(size_t at, Tk kind) const { return at < toks_.size() && toks_[at].kind == kind; }
  bool is_inf_name(size_t at) const {
    if (!is(at, Tk::Name)) return false;
    const std::string l = lower(toks_[at].text);
    return l == "inf" || l == "infinity";
  }
  bool starts_named_row(size_t at) const { return is(at, Tk::Name) && is(at + 1, Tk::Colon); }

  Section section_at(size_t at, int* used) const {
    *used = 1;
    if (at >= toks_.size() || !toks_[at].line_start || toks_[at].kind != Tk::Name) return Section::None;
    if (is(at + 1, Tk::Colon)) return Section::None;  // a row called e.g. `max:`
    const std::string w = lower(toks_[at].text);
    auto next_word = [&](const char* word) {
      return is(at + 1, Tk::Name) && toks_[at + 1].line == toks_[at].line && lower(toks_[at + 1].text) == word;
    };
    if (w == "minimize" || w == "minimum" || w == "min" || w == "minimise") return Section::Min;
    if (w == "maximize" || w == "maximum" || w == "max" || w == "maximise") return Section::Max;
    if ((w == "subject" && next_word("to")) || (w == "such" && next_word("that"))) {
      *used = 2;
      return Section::Constraints;
    }
    if (w == "st" || w == "s.t." || w == "st.") return Section::Constraints;
    if (w == "bounds" || w == "bound") return Section::Bounds;
    if (w == "general" || w == "generals" || w == "gen" || w == "integers") {
      if (next_word("constraints")) return Section::Unsupported;
      return Section::Generals;
    }
    if (w == "binary" || w == "binaries" || w == "bin") return Section::Binaries;
    if (w == "semi" || w == "semis" || w == "semi-continuous") return Section::Semi;
    if (w == "sos") return Section::Sos;
    if ((w == "lazy" && next_word("constraints")) || (w == "user" && next_word("cuts")) || w == "pwlobj")
      return Section::Unsupported;
    if (w == "end") return Section::End;
    return Section::None;
  }
  bool at_section(size_t at) const {
    int used;
    return section_at(at, &used) != Section::None;
  }

  int var_index(size_t at) {
    const std::string& name = toks_[at].text;
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    const int idx = static_cast<int>(model_.vars.size());
    model_.vars.push_back(Variable{name});
    index_.emplace(name, idx);
    return idx;
  }

  // Parses `+ t1 - t2 ...`. same_line: after the first term the expression may not continue on a new
  // line (used right of a relation, where the next line starts the next row).
  Expr parse_expr(bool same_line) {
    Expr e;
    bool first = true;
    int last_line = pos_ < toks_.size() ? toks_[pos_].line : 0;
    while (pos_ < toks_.size()) {
      const Token& t = toks_[pos_];
      if (t.kind == Tk::Rel || at_section(pos_) || starts_named_row(pos_)) break;
      if (same_line && !first && t.line != last_line) break;
      if (t.kind == Tk::Arrow) error(pos_, "indicator constraints ('{}') are not supported", t.text);
      double sign = 1.0;
      bool signed_term = false;
      while (is(pos_, Tk::Plus) || is(pos_, Tk::Minus)) {
        if (toks_[pos_].kind == Tk::Minus) sign = -sign;
        signed_term = true;
        ++pos_;
      }
      if (!first && !signed_term)
        error(pos_, "expected '+', '-' or a relation (<=, >=, =) before {}", describe(pos_));
      if (pos_ >= toks_.size()) error(pos_, "expression ends after a sign");
      const Token& u = toks_[pos_];
      if (u.kind == Tk::Number) {
        const double coef = sign * u.value;
        ++pos_;
        if (is(pos_, Tk::Star)) ++pos_;
        const bool var_follows = is(pos_, Tk::Name) && !is_inf_name(pos_) && !at_section(pos_) &&
                                 !starts_named_row(pos_) && !(same_line && toks_[pos_].line != u.line);
        if (var_follows) {
          e.lin.push_back({var_index(pos_), coef});
          ++pos_;
        } else if (is(pos_, Tk::LBracket)) {
          error(pos_, "a coefficient before '[' is not allowed; put it inside the brackets");
        } else {
          e.constant += coef;
        }
      } else if (u.kind == Tk::Name) {
        if (is_inf_name(pos_)) {
          e.constant += sign * kInf;
        } else {
          e.lin.push_back({var_index(pos_), sign});
        }
        ++pos_;
      } else if (u.kind == Tk::LBracket) {
        parse_quadratic(sign, e);
      } else if (u.kind == Tk::Arrow) {
        error(pos_, "indicator constraints ('{}') are not supported", u.text);
      } else {
        error(pos_, "expected a term (number, variable or '['), found {}", describe(pos_));
      }
      e.any_term = true;
      first = false;
      last_line = toks_[pos_ - 1].line;
    }
    merge_duplicate_terms(e.lin);
    merge_duplicate_terms(e.quad);
    return e;
  }

  // `[ a x ^ 2 + b x * y ... ] [/ d]`
  void parse_quadratic(double outer_sign, Expr& e) {
    const size_t open = pos_++;
    std::vector<QuadTerm> terms;
    bool first = true;
    while (!is(pos_, Tk::RBracket)) {
      if (pos_ >= toks_.size() || at_section(pos_)) error(open, "'[' is never closed by ']'");
      double sign = 1.0;
      bool signed_term = false;
      while (is(pos_, Tk::Plus) || is(pos_, Tk::Minus)) {
        if (toks_[pos_].kind == Tk::Minus) sign = -sign;
        signed_term = true;
        ++pos_;
      }
      if (!first && !signed_term) error(pos_, "expected '+' or '-' inside '[ ... ]', found {}", describe(pos_));
      double coef = sign;
      if (is(pos_, Tk::Number)) {
        coef *= toks_[pos_].value;
        ++pos_;
        if (is(pos_, Tk::Star)) ++pos_;
      }
      if (!is(pos_, Tk::Name) || is_inf_name(pos_))
        error(pos_, "expected a variable in a quadratic term, found {}", describe(pos_));
      const int a = var_index(pos_++);
      if (is(pos_, Tk::Caret)) {
        ++pos_;
        if (!is(pos_, Tk::Number) || toks_[pos_].value != 2.0)
          error(pos_, "expected '2' after '^' (only squares are allowed), found {}", describe(pos_));
        ++pos_;
        terms.push_back({a, a, coef});
      } else if (is(pos_, Tk::Star)) {
        ++pos_;
        if (!is(pos_, Tk::Name) || is_inf_name(pos_))
          error(pos_, "expected a variable after '*', found {}", describe(pos_));
        terms.push_back({a, var_index(pos_++), coef});
      } else {
        error(pos_, "expected '^ 2' or '* variable' after '{}' inside '[ ... ]' (linear terms go outside)",
              model_.vars[a].name);
      }
      first = false;
    }
    ++pos_;  // ']'
    double scale = outer_sign;
    if (is(pos_, Tk::Slash)) {
      ++pos_;
      if (!is(pos_, Tk::Number) || toks_[pos_].value == 0.0)
        error(pos_, "expected a nonzero number after '/', found {}", describe(pos_));
      scale /= toks_[pos_].value;
      ++pos_;
    }
    for (auto& q : terms) e.quad.push_back({q.i, q.j, q.coef * scale});
  }

  void parse_objective() {
    if (starts_named_row(pos_) && !at_section(pos_)) pos_ += 2;  // objective name, not kept
    Expr e = parse_expr(false);
    if (is(pos_, Tk::Rel)) error(pos_, "unexpected relation {} in the objective", describe(pos_));
    if (!std::isfinite(e.constant)) error(pos_ - 1, "infinite constant in the objective");
    model_.objective = std::move(e.lin);
    model_.objective_quad = std::move(e.quad);
    model_.objective_constant += e.constant;
  }

  void parse_constraints() {
    while (pos_ < toks_.size() && !at_section(pos_)) {
      const size_t start = pos_;
      std::string name;
      if (starts_named_row(pos_)) {
        name = toks_[pos_].text;
        pos_ += 2;
      }
      Expr lhs = parse_expr(false);
      if (!is(pos_, Tk::Rel))
        error(pos_ < toks_.size() ? pos_ : start, "expected a relation (<=, >=, =) in constraint{}, found {}",
              name.empty() ? "" : " '" + name + "'", describe(pos_));
      const RowSense rel1 = toks_[pos_].rel;
      const size_t rel1_at = pos_++;
      Expr mid = parse_expr(true);
      if (!mid.any_term) error(rel1_at, "expected a right-hand side after '{}', found {}", toks_[rel1_at].text,
                               describe(pos_));
      if (is(pos_, Tk::Rel) && toks_[pos_].line == toks_[pos_ - 1].line) {
        add_ranged(name, lhs, rel1, mid, rel1_at);
        continue;
      }
      Constraint row;
      row.name = name;
      row.sense = rel1;
      row.lin = std::move(lhs.lin);
      for (const auto& t : mid.lin) row.lin.push_back({t.var, -t.coef});
      row.quad = std::move(lhs.quad);
      for (const auto& q : mid.quad) row.quad.push_back({q.i, q.j, -q.coef});
      merge_duplicate_terms(row.lin);
      merge_duplicate_terms(row.quad);
      row.rhs = mid.constant - lhs.constant;
      if (std::isnan(row.rhs)) error(rel1_at, "infinite constants on both sides of '{}'", toks_[rel1_at].text);
      push_row(std::move(row));
    }
  }

  // lo <= expr <= hi (or hi >= expr >= lo)
  void add_ranged(const std::string& name, const Expr& left, RowSense rel1, const Expr& mid, size_t rel1_at) {
    const RowSense rel2 = toks_[pos_].rel;
    const size_t rel2_at = pos_++;
    Expr right = parse_expr(true);
    if (!left.lin.empty() || !left.quad.empty() || !right.lin.empty() || !right.quad.empty() || !right.any_term)
      error(rel2_at, "a ranged constraint must read 'number <= expression <= number'");
    if (rel1 != rel2 || rel1 == RowSense::EQ)
      error(rel2_at, "a ranged constraint needs two '<=' or two '>=' relations");
    double lo = left.constant - mid.constant, hi = right.constant - mid.constant;
    if (rel1 == RowSense::GE) std::swap(lo, hi);
    if (lo > hi) error(rel1_at, "empty range: {} > {}", lo, hi);
    Constraint row;
    row.name = name;
    row.lin = mid.lin;
    row.quad = mid.quad;
    if (lo == hi) {
      row.sense = RowSense::EQ;
      row.rhs = lo;
      push_row(std::move(row));
      return;
    }
    Constraint upper = row;
    row.sense = RowSense::GE;
    row.rhs = lo;
    push_row(std::move(row));
    upper.name = model_.rows.back().name + "_hi";
    upper.sense = RowSense::LE;
    upper.rhs = hi;
    push_row(std::move(upper));
  }

  void push_row(Constraint row) {
    if (row.name.empty()) row.name = "R" + std::to_string(model_.rows.size());
    model_.rows.push_back(std::move(row));
  }

  double parse_value() {
    double sign = 1.0;
    while (is(pos_, Tk::Plus) || is(pos_, Tk::Minus)) {
      if (toks_[pos_].kind == Tk::Minus) sign = -sign;
      ++pos_;
    }
    if (is(pos_, Tk::Number)) return sign * toks_[pos_++].value;
    if (is_inf_name(pos_)) {
      ++pos_;
      return sign * kInf;
    }
    error(pos_, "expected a number or 'inf' in a bound, found {}", describe(pos_));
  }

  void apply_bound(int var, RowSense rel, double value, size_t at) {
    Variable& v = model_.vars[var];
    if (rel == RowSense::EQ && !std::isfinite(value)) error(at, "cannot fix '{}' at {}", v.name, value);
    if (rel != RowSense::GE) v.ub = value;
    if (rel != RowSense::LE) v.lb = value;
  }

  void parse_bounds() {
    while (pos_ < toks_.size() && !at_section(pos_)) {
      if (is(pos_, Tk::Name) && !is_inf_name(pos_)) {
        const size_t name_at = pos_;
        if (is(pos_ + 1, Tk::Name) && lower(toks_[pos_ + 1].text) == "free") {
          Variable& v = model_.vars[var_index(name_at)];
          v.lb = -kInf;
          v.ub = kInf;
          pos_ += 2;
          continue;
        }
        const int var = var_index(pos_++);
        if (!is(pos_, Tk::Rel))
          error(pos_, "expected 'free' or a relation after '{}' in Bounds, found {}", toks_[name_at].text,
                describe(pos_));
        const RowSense rel = toks_[pos_++].rel;
        apply_bound(var, rel, parse_value(), name_at);
        continue;
      }
      const size_t start = pos_;
      const double first = parse_value();
      if (!is(pos_, Tk::Rel)) error(pos_, "expected a relation in Bounds, found {}", describe(pos_));
      const RowSense rel1 = toks_[pos_++].rel;
      if (!is(pos_, Tk::Name) || is_inf_name(pos_))
        error(pos_, "expected a variable name in Bounds, found {}", describe(pos_));
      const int var = var_index(pos_++);
      // `v <= x` is `x >= v`.
      const RowSense flipped = rel1 == RowSense::LE ? RowSense::GE : rel1 == RowSense::GE ? RowSense::LE : rel1;
      apply_bound(var, flipped, first, start);
      if (is(pos_, Tk::Rel) && toks_[pos_].line == toks_[pos_ - 1].line) {
        const RowSense rel2 = toks_[pos_++].rel;
        apply_bound(var, rel2, parse_value(), start);
      }
    }
  }

  void parse_type_list(VarType type) {
    while (pos_ < toks_.size() && !at_section(pos_)) {
      if (!is(pos_, Tk::Name) || is_inf_name(pos_))
        error(pos_, "expected a variable name in the {} section, found {}",
              type == VarType::Binary ? "Binaries" : "Generals", describe(pos_));
      Variable& v = model_.vars[var_index(pos_++)];
      v.type = type;
      if (type == VarType::Binary) {
        v.lb = std::max(v.lb, 0.0);
        v.ub = std::min(v.ub, 1.0);
      }
    }
  }

  // Gurobi's objective constant: `+ c Constant` with `Constant = 1` in Bounds.
  void finish() {
    if (!opts_.fold_constant_variable) return;
    auto it = index_.find("Constant");
    if (it == index_.end()) return;
    const int k = it->second;
    const Variable& v = model_.vars[k];
    if (v.type != VarType::Continuous || v.lb != v.ub || !std::isfinite(v.lb)) return;
    for (const auto& r : model_.rows) {
      for (const auto& t : r.lin)
        if (t.var == k) return;
      for (const auto& q : r.quad)
        if (q.i == k || q.j == k) return;
    }
    for (const auto& q : model_.objective_quad)
      if (q.i == k || q.j == k) return;
    std::vector<LinTerm> objective;
    for (const auto& t : model_.objective) {
      if (t.var == k)
        model_.objective_constant += t.coef * v.lb;
      else
        objective.push_back(t);
    }
    model_.objective = std::move(objective);
    model_.vars.erase(model_.vars.begin() + k);
    auto shift = [k](int& j) { j -= j > k ? 1 : 0; };
    for (auto& t : model_.objective) shift(t.var);
    for (auto& q : model_.objective_quad) shift(q.i), shift(q.j);
    for (auto& r : model_.rows) {
      for (auto& t : r.lin) shift(t.var);
      for (auto& q : r.quad) shift(q.i), shift(q.j);
    }
  }

  std::string source_;
  LpReadOptions opts_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  bool seen_objective_ = false;
  Model model_;
  std::unordered_map<std::string, int> index_;
};

}  // namespace

Model read_lp(std::string_view text, const std::string& source_name, const LpReadOptions& opts) {
  require_text(text, source_name, "LP file");
  return LpParser(text, source_name, opts).parse();
}

Model read_lp_file(const std::filesystem::path& path, const LpReadOptions& opts) {
  Model m = read_lp(read_text_file(path), path.string(), opts);
  if (m.name.empty()) m.name = path.stem().string();
  return m;
}

}  // namespace trex::orkit
