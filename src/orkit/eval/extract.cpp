#include "orkit/eval/extract.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <vector>

namespace trex::orkit::eval {

namespace {

struct Block {
  std::string lang;  // lower-case, may be empty
  std::string body;
};

std::string lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = char(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

std::string trim(std::string_view s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

// Splits ``` fenced blocks (the fence may be indented; ~~~ is not used by chat models).
std::vector<Block> fenced_blocks(std::string_view text) {
  std::vector<Block> out;
  size_t pos = 0;
  bool in = false;
  Block cur;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    std::string t = trim(line);
    if (t.rfind("```", 0) == 0) {
      if (!in) {
        in = true;
        cur = Block{};
        std::string tag = trim(t.substr(3));
        size_t sp = tag.find_first_of(" \t{");
        cur.lang = lower(tag.substr(0, sp));
      } else if (t == "```" || t.find_first_not_of('`') == std::string::npos) {
        in = false;
        out.push_back(cur);
      } else {
        cur.body.append(line).append("\n");
      }
    } else if (in) {
      cur.body.append(line).append("\n");
    }
    if (eol == text.size()) break;
    pos = eol + 1;
  }
  return out;
}

CodeFormat tag_format(const std::string& lang) {
  if (lang == "python" || lang == "py" || lang == "python3" || lang == "gurobipy") return CodeFormat::Python;
  if (lang == "lp" || lang == "cplex" || lang == "cplex-lp" || lang == "cplexlp") return CodeFormat::Lp;
  if (lang == "mps") return CodeFormat::Mps;
  if (lang == "mathprog" || lang == "gmpl" || lang == "ampl" || lang == "mod" || lang == "glpk")
    return CodeFormat::MathProg;
  return CodeFormat::None;
}

}  // namespace

const char* format_name(CodeFormat f) {
  switch (f) {
    case CodeFormat::None:
      return "none";
    case CodeFormat::Python:
      return "python";
    case CodeFormat::Lp:
      return "lp";
    case CodeFormat::Mps:
      return "mps";
    case CodeFormat::MathProg:
      return "mathprog";
  }
  return "?";
}

CodeFormat sniff_format(std::string_view text) {
  static const std::regex mps_rows(R"((^|\n)ROWS[ \t]*\r?\n)"), mps_cols(R"((^|\n)COLUMNS[ \t]*\r?\n)");
  static const std::regex lp_obj(
      R"((^|\n)[ \t]*(minimi[sz]e|maximi[sz]e|minimum|maximum|min|max)[ \t]*\r?\n)", std::regex::icase);
  static const std::regex lp_st(R"((^|\n)[ \t]*(subject to|such that|s\.t\.|st\.?)[ \t]*\r?\n)",
                                std::regex::icase);
  static const std::regex mp_var(R"((^|[\n;])[ \t]*var[ \t]+\w+[^;]*;)");
  static const std::regex mp_obj(R"((^|[\n;])[ \t]*(maximize|minimize|s\.t\.|subject to)[ \t]+\w+[^;]*:)");
  static const std::regex py(
      R"((^|\n)[ \t]*(import[ \t]+\w+|from[ \t]+[\w.]+[ \t]+import|def[ \t]+\w+[ \t]*\(|\w+[ \t]*=[ \t]*[\w.]*Model\())");
  const std::string s(text);
  if (std::regex_search(s, mps_rows) && std::regex_search(s, mps_cols)) return CodeFormat::Mps;
  if (std::regex_search(s, mp_var) && std::regex_search(s, mp_obj)) return CodeFormat::MathProg;
  if (std::regex_search(s, lp_obj) && std::regex_search(s, lp_st)) return CodeFormat::Lp;
  if (std::regex_search(s, py)) return CodeFormat::Python;
  return CodeFormat::None;
}

ExtractedCode extract_code(std::string_view response) {
  const auto blocks = fenced_blocks(response);
  auto longest = [&](auto pred) -> const Block* {
    const Block* best = nullptr;
    for (const auto& b : blocks)
      if (pred(b) && (!best || b.body.size() > best->body.size())) best = &b;
    return best;
  };
  if (const Block* b = longest([](const Block& b) { return tag_format(b.lang) == CodeFormat::Python; }))
    return {CodeFormat::Python, b->body, "fenced python block"};
  if (const Block* b = longest([](const Block& b) { return tag_format(b.lang) != CodeFormat::None; }))
    return {tag_format(b->lang), b->body, "fenced " + b->lang + " block"};
  auto untagged_ok = [](const Block& b, size_t min_len) {
    return tag_format(b.lang) == CodeFormat::None && b.body.size() > min_len &&
           sniff_format(b.body) != CodeFormat::None;
  };
  const Block* b = longest([&](const Block& x) { return untagged_ok(x, 50); });
  if (!b) b = longest([&](const Block& x) { return untagged_ok(x, 0); });
  if (b) {
    CodeFormat f = sniff_format(b->body);
    return {f, b->body, std::string("untagged block (content: ") + format_name(f) + ")"};
  }
  // <python> ... </python> (longest)
  {
    std::string best;
    size_t pos = 0;
    while ((pos = response.find("<python>", pos)) != std::string_view::npos) {
      size_t end = response.find("</python>", pos);
      std::string_view inner =
          response.substr(pos + 8, (end == std::string_view::npos ? response.size() : end) - pos - 8);
      if (inner.size() > best.size()) best = std::string(inner);
      pos += 8;
    }
    if (!trim(best).empty() && sniff_format(best) != CodeFormat::None)
      return {sniff_format(best), trim(best) + "\n", "<python> tags"};
  }
  std::string_view tail = response;
  size_t think = response.rfind("</think>");
  if (think != std::string_view::npos) tail = response.substr(think + 8);
  CodeFormat f = sniff_format(tail);
  if (f != CodeFormat::None) return {f, trim(tail) + "\n", "bare text"};
  return {CodeFormat::None, "", "no code found"};
}

}  // namespace trex::orkit::eval
