#include "data/regex.h"

#include <limits>

#include "core/error.h"
#include "data/unicode.h"

namespace trex::re {

using unicode::Cat;

namespace {

// One member of a character class. Kinds: a code-point range, a set of general categories, white space.
struct ClassAtom {
  enum Kind { Range, Cats, Space } kind = Range;
  char32_t lo = 0, hi = 0;
  uint64_t cats = 0;  // bit (1 << Cat)
  bool negated = false;
};

uint64_t cat_bit(Cat c) { return uint64_t(1) << int(c); }

const Cat* bmp_table() {
  static const auto* table = [] {
    auto* t = new Cat[0x10000];
    for (char32_t c = 0; c < 0x10000; ++c) t[c] = unicode::category(c);
    return t;
  }();
  return table;
}
inline Cat cat_of(char32_t c) { return c < 0x10000 ? bmp_table()[c] : unicode::category(c); }

inline char32_t fold_ascii(char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

}  // namespace

struct Node {
  enum Kind { Empty, Char, Class, Any, Seq, Alt, Repeat, Look, Bol, Eol } kind = Empty;
  char32_t ch = 0;
  bool icase = false;
  std::vector<ClassAtom> atoms;
  bool negated = false;  // Class: [^...]; Look: (?!...)
  std::vector<std::unique_ptr<Node>> kids;
  int min = 0, max = 0;
  bool greedy = true;

  bool single_char() const { return kind == Char || kind == Class || kind == Any; }
  bool test(char32_t c) const {
    switch (kind) {
      case Char: return icase ? fold_ascii(c) == fold_ascii(ch) : c == ch;
      case Any: return c != '\n';
      case Class: {
        bool hit = false;
        for (const auto& a : atoms) {
          bool m;
          if (a.kind == ClassAtom::Range) {
            m = c >= a.lo && c <= a.hi;
            if (!m && icase && c < 128) {
              char32_t alt = c >= 'a' && c <= 'z' ? c - 32 : fold_ascii(c);
              m = alt >= a.lo && alt <= a.hi;
            }
          } else if (a.kind == ClassAtom::Cats) {
            m = c < unicode::kInvalidBase && (a.cats & cat_bit(cat_of(c))) != 0;
          } else {
            m = unicode::is_white_space(c);
          }
          if (m != a.negated) {
            hit = true;
            break;
          }
        }
        return hit != negated;
      }
      default: return false;
    }
  }
};

namespace {

class Parser {
 public:
  Parser(std::string_view pattern) : pattern_(pattern) {
    std::vector<uint32_t> offs;
    unicode::decode_utf8(pattern, p_, offs);
  }
  std::unique_ptr<Node> parse() {
    auto n = alternation(false);
    if (i_ < p_.size()) error("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail("regex /{}/: {} at character {}", pattern_, what, i_);
  }
  bool at_end() const { return i_ >= p_.size(); }
  char32_t peek() const { return p_[i_]; }
  bool eat(char32_t c) {
    if (!at_end() && p_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  std::unique_ptr<Node> alternation(bool icase) {
    auto first = sequence(icase);
    if (at_end() || peek() != '|') return first;
    auto alt = std::make_unique<Node>();
    alt->kind = Node::Alt;
    alt->kids.push_back(std::move(first));
    while (eat('|')) alt->kids.push_back(sequence(icase));
    return alt;
  }

  std::unique_ptr<Node> sequence(bool icase) {
    auto seq = std::make_unique<Node>();
    seq->kind = Node::Seq;
    while (!at_end() && peek() != '|' && peek() != ')') {
      auto atom_node = atom(icase);
      seq->kids.push_back(quantified(std::move(atom_node)));
    }
    if (seq->kids.size() == 1) return std::move(seq->kids[0]);
    if (seq->kids.empty()) seq->kind = Node::Empty;
    return seq;
  }

  int number() {
    if (at_end() || peek() < '0' || peek() > '9') error("expected a number in {m,n}");
    long v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + long(peek() - '0');
      if (v > 100000) error("repeat count too large");
      ++i_;
    }
    return int(v);
  }

  std::unique_ptr<Node> quantified(std::unique_ptr<Node> a) {
    if (at_end()) return a;
    int mn, mx;
    char32_t c = peek();
    if (c == '?') mn = 0, mx = 1, ++i_;
    else if (c == '*') mn = 0, mx = std::numeric_limits<int>::max(), ++i_;
    else if (c == '+') mn = 1, mx = std::numeric_limits<int>::max(), ++i_;
    else if (c == '{') {
      ++i_;
      mn = number();
      mx = mn;
      if (eat(',')) mx = (!at_end() && peek() == '}') ? std::numeric_limits<int>::max() : number();
      if (!eat('}')) error("expected '}'");
      if (mx < mn) error("{m,n} with n < m");
    } else {
      return a;
    }
    if (a->kind == Node::Look || a->kind == Node::Bol || a->kind == Node::Eol) error("quantifier on an assertion");
    auto r = std::make_unique<Node>();
    r->kind = Node::Repeat;
    r->min = mn, r->max = mx;
    if (eat('?')) r->greedy = false;
    else if (!at_end() && peek() == '+') error("possessive quantifiers are not supported");
    r->kids.push_back(std::move(a));
    if (!at_end() && (peek() == '?' || peek() == '*' || peek() == '+' || peek() == '{')) error("nested quantifier");
    return r;
  }

  char32_t hex_digits(int count_max, bool braced) {
    char32_t v = 0;
    int n = 0;
    while (!at_end() && n < count_max) {
      char32_t c = peek();
      int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
              : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
      if (d < 0) break;
      v = v * 16 + char32_t(d);
      ++n, ++i_;
    }
    if (n == 0 || (!braced && n != count_max)) error("bad hex escape");
    return v;
  }

  uint64_t category_set(const std::string& name) {
    struct E { const char* n; std::initializer_list<Cat> c; };
    static const E table[] = {
        {"L", {Cat::Lu, Cat::Ll, Cat::Lt, Cat::Lm, Cat::Lo}}, {"Letter", {Cat::Lu, Cat::Ll, Cat::Lt, Cat::Lm, Cat::Lo}},
        {"Lu", {Cat::Lu}}, {"Ll", {Cat::Ll}}, {"Lt", {Cat::Lt}}, {"Lm", {Cat::Lm}}, {"Lo", {Cat::Lo}},
        {"M", {Cat::Mn, Cat::Mc, Cat::Me}}, {"Mn", {Cat::Mn}}, {"Mc", {Cat::Mc}}, {"Me", {Cat::Me}},
        {"N", {Cat::Nd, Cat::Nl, Cat::No}}, {"Nd", {Cat::Nd}}, {"Nl", {Cat::Nl}}, {"No", {Cat::No}},
        {"P", {Cat::Pc, Cat::Pd, Cat::Ps, Cat::Pe, Cat::Pi, Cat::Pf, Cat::Po}}, {"Pc", {Cat::Pc}},
        {"Pd", {Cat::Pd}}, {"Ps", {Cat::Ps}}, {"Pe", {Cat::Pe}}, {"Pi", {Cat::Pi}}, {"Pf", {Cat::Pf}},
        {"Po", {Cat::Po}}, {"S", {Cat::Sm, Cat::Sc, Cat::Sk, Cat::So}}, {"Sm", {Cat::Sm}}, {"Sc", {Cat::Sc}},
        {"Sk", {Cat::Sk}}, {"So", {Cat::So}}, {"Z", {Cat::Zs, Cat::Zl, Cat::Zp}}, {"Zs", {Cat::Zs}},
        {"Zl", {Cat::Zl}}, {"Zp", {Cat::Zp}}, {"C", {Cat::Cc, Cat::Cf, Cat::Cs, Cat::Co, Cat::Cn}},
        {"Cc", {Cat::Cc}}, {"Cf", {Cat::Cf}}, {"Co", {Cat::Co}}, {"Cs", {Cat::Cs}}, {"Cn", {Cat::Cn}}};
    for (const auto& e : table)
      if (name == e.n) {
        uint64_t m = 0;
        for (Cat c : e.c) m |= cat_bit(c);
        return m;
      }
    error("unknown Unicode category \\p{" + name + "}");
  }

  // After a backslash: a class escape (returns true and fills atom) or a literal (returns false, sets lit).
  bool escape(ClassAtom& atom, char32_t& lit) {
    if (at_end()) error("trailing backslash");
    char32_t c = p_[i_++];
    switch (c) {
      case 'p': case 'P': {
        std::string name;
        if (eat('{')) {
          while (!at_end() && peek() != '}') name.push_back(char(p_[i_++]));
          if (!eat('}')) error("unterminated \\p{");
        } else {
          if (at_end()) error("bad \\p");
          name.push_back(char(p_[i_++]));
        }
        bool neg = c == 'P';
        if (!name.empty() && name[0] == '^') neg = !neg, name.erase(0, 1);
        atom = {ClassAtom::Cats, 0, 0, category_set(name), neg};
        return true;
      }
      case 's': case 'S': atom = {ClassAtom::Space, 0, 0, 0, c == 'S'}; return true;
      case 'd': case 'D': atom = {ClassAtom::Cats, 0, 0, cat_bit(Cat::Nd), c == 'D'}; return true;
      case 'w': case 'W': {
        uint64_t m = category_set("L") | category_set("M") | cat_bit(Cat::Nd) | cat_bit(Cat::Pc);
        atom = {ClassAtom::Cats, 0, 0, m, c == 'W'};
        return true;
      }
      case 'n': lit = '\n'; return false;
      case 'r': lit = '\r'; return false;
      case 't': lit = '\t'; return false;
      case 'f': lit = '\f'; return false;
      case 'v': lit = '\v'; return false;
      case '0': lit = 0; return false;
      case 'x':
        if (eat('{')) {
          lit = hex_digits(6, true);
          if (!eat('}')) error("unterminated \\x{");
        } else {
          lit = hex_digits(2, false);
        }
        return false;
      case 'u': lit = hex_digits(4, false); return false;
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
          error(std::string("unsupported escape \\") + char(c));
        lit = c;
        return false;
    }
  }

  std::unique_ptr<Node> char_class(bool icase) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Class;
    n->icase = icase;
    if (eat('^')) n->negated = true;
    bool first = true;
    while (true) {
      if (at_end()) error("unterminated [");
      char32_t c = peek();
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      char32_t lo;
      if (c == '[') error("nested classes are not supported");
      if (c == '\\') {
        ++i_;
        ClassAtom a;
        if (escape(a, lo)) {
          n->atoms.push_back(a);
          continue;
        }
      } else {
        lo = c;
        ++i_;
      }
      char32_t hi = lo;
      if (!at_end() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        char32_t h = p_[i_++];
        if (h == '\\') {
          ClassAtom a;
          if (escape(a, hi)) error("class escape as a range end");
        } else {
          hi = h;
        }
        if (hi < lo) error("range out of order");
      }
      n->atoms.push_back({ClassAtom::Range, lo, hi, 0, false});
    }
    return n;
  }

  std::unique_ptr<Node> atom(bool icase) {
    char32_t c = p_[i_++];
    auto n = std::make_unique<Node>();
    n->icase = icase;
    switch (c) {
      case '(': {
        bool group_icase = icase;
        if (eat('?')) {
          if (eat(':')) {
          } else if (eat('=') || (!at_end() && peek() == '!')) {
            bool neg = eat('!');
            n->kind = Node::Look;
            n->negated = neg;
            n->kids.push_back(alternation(icase));
            if (!eat(')')) error("unterminated lookahead");
            return n;
          } else if (eat('i')) {
            if (eat(':')) group_icase = true;
            else error("only (?i: ... ) is supported as a flag group");
          } else {
            error("unsupported group syntax (?");
          }
        }
        auto inner = alternation(group_icase);
        if (!eat(')')) error("unterminated (");
        return inner;
      }
      case ')': error("unbalanced ')'");
      case '[': return char_class(icase);
      case '.': n->kind = Node::Any; return n;
      case '^': n->kind = Node::Bol; return n;
      case '$': n->kind = Node::Eol; return n;
      case '*': case '+': case '?': error("quantifier without a target");
      case '\\': {
        ClassAtom a;
        char32_t lit;
        if (escape(a, lit)) {
          n->kind = Node::Class;
          n->atoms.push_back(a);
        } else {
          n->kind = Node::Char;
          n->ch = lit;
        }
        return n;
      }
      default: n->kind = Node::Char; n->ch = c; return n;
    }
  }

  std::string pattern_;
  std::vector<char32_t> p_;
  size_t i_ = 0;
};

struct Cont {
  bool (*fn)(const void*, size_t);
  const void* ctx;
  bool operator()(size_t i) const { return fn(ctx, i); }
};
template <class F>
Cont make_cont(const F& f) {
  return {[](const void* c, size_t i) { return (*static_cast<const F*>(c))(i); }, &f};
}

struct Matcher {
  const char32_t* s;
  size_t n;

  bool match(const Node* node, size_t i, Cont k) const {
    switch (node->kind) {
      case Node::Empty: return k(i);
      case Node::Char: case Node::Class: case Node::Any:
        return i < n && node->test(s[i]) && k(i + 1);
      case Node::Bol: return i == 0 && k(i);
      case Node::Eol: return i == n && k(i);
      case Node::Seq: return seq(node, 0, i, k);
      case Node::Alt:
        for (const auto& kid : node->kids)
          if (match(kid.get(), i, k)) return true;
        return false;
      case Node::Look: {
        auto accept = [](size_t) { return true; };
        bool hit = match(node->kids[0].get(), i, make_cont(accept));
        return hit != node->negated && k(i);
      }
      case Node::Repeat: {
        const Node* kid = node->kids[0].get();
        if (kid->single_char()) {
          size_t limit = std::min(n - i, size_t(node->max)), count = 0;
          while (count < limit && kid->test(s[i + count])) ++count;
          if (count < size_t(node->min)) return false;
          if (node->greedy) {
            for (size_t c = count + 1; c-- > size_t(node->min);)
              if (k(i + c)) return true;
          } else {
            for (size_t c = size_t(node->min); c <= count; ++c)
              if (k(i + c)) return true;
          }
          return false;
        }
        return rep(node, 0, i, k);
      }
    }
    return false;
  }

  bool seq(const Node* node, size_t idx, size_t i, Cont k) const {
    if (idx == node->kids.size()) return k(i);
    auto next = [&](size_t j) { return seq(node, idx + 1, j, k); };
    return match(node->kids[idx].get(), i, make_cont(next));
  }

  bool rep(const Node* node, int count, size_t i, Cont k) const {
    auto more = [&](size_t j) { return j != i && rep(node, count + 1, j, k); };
    if (node->greedy) {
      if (count < node->max && match(node->kids[0].get(), i, make_cont(more))) return true;
      return count >= node->min && k(i);
    }
    if (count >= node->min && k(i)) return true;
    return count < node->max && match(node->kids[0].get(), i, make_cont(more));
  }
};

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern) {
  Parser p(pattern);
  root_ = p.parse();
  bmp_table();
}
Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

bool Regex::search(const char32_t* cps, size_t n, size_t from, size_t& mb, size_t& me) const {
  Matcher m{cps, n};
  size_t end = 0;
  auto record = [&](size_t j) {
    end = j;
    return true;
  };
  for (size_t start = from; start <= n; ++start) {
    if (m.match(root_.get(), start, make_cont(record))) {
      mb = start, me = end;
      return true;
    }
  }
  return false;
}

}  // namespace trex::re
