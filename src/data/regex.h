// A small backtracking regex engine over Unicode code points, for Hugging Face pre-tokenizer patterns
// (GPT-2, Llama-3, DeepSeek-V3 style). Semantics are Perl/Oniguruma leftmost-first.
// Supported: literals, '.', [...] classes with ranges and negation, \p{X} / \P{X} for general categories
// (L, Lu, Ll, Lt, Lm, Lo, M, Mn, Mc, Me, N, Nd, Nl, No, P, Pc, Pd, Ps, Pe, Pi, Pf, Po, S, Sm, Sc, Sk, So,
// Z, Zs, Zl, Zp, C, Cc, Cf, Co, Cn), \s \S \d \D \w \W, \r \n \t \f \v \xHH \x{H..} \uHHHH, escapes of
// punctuation, groups ( ), (?: ), (?i: ) (ASCII case folding), lookahead (?= ) (?! ), alternation,
// quantifiers ? * + {m} {m,} {m,n} and their lazy forms, anchors ^ $. Anything else is an error that
// names the pattern and position.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace trex::re {

struct Node;

class Regex {
 public:
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Leftmost match starting at or after `from` in cps[0, n). Returns false when there is none.
  bool search(const char32_t* cps, size_t n, size_t from, size_t& match_begin, size_t& match_end) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::unique_ptr<Node> root_;
};

}  // namespace trex::re
