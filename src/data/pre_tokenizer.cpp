#include "data/pre_tokenizer.h"

#include "core/error.h"
#include "data/regex.h"
#include "data/unicode.h"

namespace trex::data {

using json = nlohmann::json;

// GPT-2's pattern, used by ByteLevel when use_regex is true.
static const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizer::Step {
  enum Kind { SplitRegex, SplitString, Digits, ByteLevel } kind;
  enum Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext } behavior = Isolated;
  std::unique_ptr<re::Regex> regex;
  std::string literal;
  bool individual_digits = false, add_prefix_space = false;
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;

json PreTokenizer::deepseek_v3_json() {
  auto split = [](const std::string& re) {
    return json{{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  return json{{"type", "Sequence"},
              {"pretokenizers",
               {split(R"(\p{N}{1,3})"), split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
                split(R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
                json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

static void add_step(std::vector<std::unique_ptr<PreTokenizer::Step>>& steps, bool& byte_level, const json& j,
                     const std::string& where) {
  using Step = PreTokenizer::Step;
  TREX_CHECK(j.is_object() && j.contains("type"), "{}: pre_tokenizer entry without a type", where);
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    for (const auto& s : j.at("pretokenizers")) add_step(steps, byte_level, s, where);
    return;
  }
  auto st = std::make_unique<Step>();
  if (type == "Split") {
    const auto& pat = j.at("pattern");
    std::string beh = j.value("behavior", "Isolated");
    if (beh == "Isolated") st->behavior = Step::Isolated;
    else if (beh == "Removed") st->behavior = Step::Removed;
    else if (beh == "MergedWithPrevious") st->behavior = Step::MergedWithPrevious;
    else if (beh == "MergedWithNext") st->behavior = Step::MergedWithNext;
    else fail("{}: pre_tokenizer Split behavior '{}' is not supported", where, beh);
    TREX_CHECK(!j.value("invert", false), "{}: pre_tokenizer Split with invert=true is not supported", where);
    if (pat.contains("Regex")) {
      st->kind = Step::SplitRegex;
      try {
        st->regex = std::make_unique<re::Regex>(pat["Regex"].get<std::string>());
      } catch (const Error& e) {
        fail("{}: {}", where, e.what());
      }
    } else if (pat.contains("String")) {
      st->kind = Step::SplitString;
      st->literal = pat["String"].get<std::string>();
      TREX_CHECK(!st->literal.empty(), "{}: empty Split string", where);
    } else {
      fail("{}: Split pattern needs Regex or String", where);
    }
  } else if (type == "Digits") {
    st->kind = Step::Digits;
    st->individual_digits = j.value("individual_digits", false);
  } else if (type == "ByteLevel") {
    st->kind = Step::ByteLevel;
    st->add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) st->regex = std::make_unique<re::Regex>(kGpt2Pattern);
    byte_level = true;
  } else {
    fail("{}: pre_tokenizer type '{}' is not supported (Sequence, Split, Digits, ByteLevel are)", where, type);
  }
  steps.push_back(std::move(st));
}

std::shared_ptr<const PreTokenizer> PreTokenizer::from_json(const json& j, const std::string& where) {
  auto p = std::make_shared<PreTokenizer>();
  if (!j.is_null()) add_step(p->steps_, p->byte_level_, j, where);
  return p;
}

namespace {

// Cuts `piece` at the match ranges [code-point indices] according to the behaviour.
void emit_parts(std::string_view piece, const std::vector<uint32_t>& offs,
                const std::vector<std::pair<size_t, size_t>>& matches, PreTokenizer::Step::Behavior beh,
                std::vector<std::string>& out) {
  using Step = PreTokenizer::Step;
  const size_t n = offs.size() - 1;
  auto bytes = [&](size_t a, size_t b) { return std::string(piece.substr(offs[a], offs[b] - offs[a])); };
  size_t last = 0;
  std::string pending;  // MergedWithNext: a match waiting for the following gap
  bool have_pending = false;
  for (auto [mb, me] : matches) {
    if (mb > last) {
      std::string gap = bytes(last, mb);
      if (have_pending) gap = pending + gap, have_pending = false;
      out.push_back(std::move(gap));
    }
    std::string m = bytes(mb, me);
    switch (beh) {
      case Step::Isolated:
        if (have_pending) out.push_back(pending), have_pending = false;
        out.push_back(std::move(m));
        break;
      case Step::Removed: break;
      case Step::MergedWithPrevious:
        if (mb > last && !out.empty()) out.back() += m;
        else out.push_back(std::move(m));
        break;
      case Step::MergedWithNext:
        if (have_pending) pending += m;
        else pending = std::move(m), have_pending = true;
        break;
    }
    last = me;
  }
  if (last < n) {
    std::string gap = bytes(last, n);
    if (have_pending) gap = pending + gap, have_pending = false;
    out.push_back(std::move(gap));
  }
  if (have_pending) out.push_back(pending);
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.emplace_back(text);
  std::vector<std::string> next;
  std::vector<char32_t> cps;
  std::vector<uint32_t> offs;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const auto& st : steps_) {
    next.clear();
    for (auto& piece : pieces) {
      if (st->kind == Step::ByteLevel && st->add_prefix_space && piece[0] != ' ') piece.insert(0, 1, ' ');
      if (st->kind == Step::ByteLevel && !st->regex) {
        next.push_back(std::move(piece));
        continue;
      }
      matches.clear();
      if (st->kind == Step::SplitString) {
        // Byte positions double as "code point" indices through an identity offset table.
        offs.resize(piece.size() + 1);
        for (size_t i = 0; i <= piece.size(); ++i) offs[i] = uint32_t(i);
        for (size_t p = piece.find(st->literal); p != std::string::npos; p = piece.find(st->literal, p + st->literal.size()))
          matches.emplace_back(p, p + st->literal.size());
      } else {
        unicode::decode_utf8(piece, cps, offs);
        const size_t n = cps.size();
        if (st->kind == Step::Digits) {
          for (size_t i = 0; i < n;) {
            bool digit = cps[i] < unicode::kInvalidBase && unicode::major_of(unicode::category(cps[i])) == 2;
            if (!digit) {
              ++i;
              continue;
            }
            size_t j = i + 1;
            if (!st->individual_digits)
              while (j < n && cps[j] < unicode::kInvalidBase && unicode::major_of(unicode::category(cps[j])) == 2) ++j;
            matches.emplace_back(i, j);
            i = j;
          }
        } else {
          size_t pos = 0, mb, me;
          while (pos <= n && st->regex->search(cps.data(), n, pos, mb, me)) {
            if (me == mb) {  // empty match: no split, move on
              pos = mb + 1;
              continue;
            }
            matches.emplace_back(mb, me);
            pos = me;
          }
        }
      }
      emit_parts(piece, offs, matches, st->kind == Step::SplitString || st->kind == Step::SplitRegex ? st->behavior
                                                                                                      : Step::Isolated,
                 next);
    }
    pieces.swap(next);
  }
}

}  // namespace trex::data
