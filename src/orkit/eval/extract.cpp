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

namespace {

const Block* longest_block(const std::vector<Block>& blocks, bool python, size_t min_len = 0) {
  const Block* best = nullptr;
  for (const auto& b : blocks) {
    // "plain": any fence not tagged python (the tag itself is not part of the code)
    if (python != (b.lang == "python")) continue;
    if (b.body.size() <= min_len && min_len > 0) continue;
    if (!best || b.body.size() > best->body.size()) best = &b;
  }
  return best;
}

// The text after the last closing think tag and the think section before it; npos-free.
void split_think(std::string_view response, std::string_view& before, std::string_view& after, bool& found) {
  found = false;
  size_t at = std::string_view::npos, len = 0;
  for (std::string_view tag : {std::string_view("</think>"), std::string_view("</redacted_reasoning>")}) {
    const size_t p = response.rfind(tag);
    if (p != std::string_view::npos && (at == std::string_view::npos || p > at)) at = p, len = tag.size();
  }
  if (at == std::string_view::npos) {
    before = {};
    after = response;
    return;
  }
  found = true;
  before = response.substr(0, at);
  after = response.substr(at + len);
}

ExtractedCode as_python(std::string code, std::string how) {
  return {CodeFormat::Python, std::move(code), std::move(how)};
}

}  // namespace

ExtractedCode extract_code_report_solver(std::string_view response) {
  const auto blocks = fenced_blocks(response);
  if (const Block* b = longest_block(blocks, true)) return as_python(b->body, "report: fenced python block");
  if (const Block* b = longest_block(blocks, false, 50)) return as_python(b->body, "report: plain block > 50 chars");
  if (const Block* b = longest_block(blocks, false)) return as_python(b->body, "report: plain block");
  {
    std::string best;
    bool any = false;
    for (size_t pos = 0; (pos = response.find("<python>", pos)) != std::string_view::npos; pos += 8) {
      const size_t end = response.find("</python>", pos + 8);
      if (end == std::string_view::npos) break;
      std::string_view inner = response.substr(pos + 8, end - pos - 8);
      if (!any || inner.size() > best.size()) best = std::string(inner), any = true;
    }
    if (any) {
      const auto inner_blocks = fenced_blocks(best);
      const Block* in = nullptr;
      for (const auto& b : inner_blocks)
        if (!in || b.body.size() > in->body.size()) in = &b;
      return as_python(in ? in->body : trim(best) + "\n", "report: <python> tags");
    }
  }
  std::string_view think, after;
  bool has_think = false;
  split_think(response, think, after, has_think);
  if (has_think) {
    const auto tail_blocks = fenced_blocks(after);
    const Block* b = nullptr;
    for (const auto& x : tail_blocks)
      if (!b || x.body.size() > b->body.size()) b = &x;
    if (b) return as_python(b->body, "report: block after </think>");
    if (!trim(after).empty()) return as_python(trim(after) + "\n", "report: text after </think>");
    const auto think_blocks = fenced_blocks(think);
    for (const auto& x : think_blocks)
      if (!b || x.body.size() > b->body.size()) b = &x;
    if (b) return as_python(b->body, "report: block in the think section");
  }
  return as_python(std::string(response), "report: whole response");
}

ExtractedCode extract_code_report_orgeval(std::string_view response) {
  std::string_view think, after;
  bool has_think = false;
  split_think(response, think, after, has_think);
  const auto after_blocks = fenced_blocks(after), all_blocks = fenced_blocks(response);
  if (const Block* b = longest_block(after_blocks, true)) return as_python(b->body, "report: python block after think");
  if (const Block* b = longest_block(all_blocks, true)) return as_python(b->body, "report: python block");
  if (const Block* b = longest_block(after_blocks, false)) return as_python(b->body, "report: plain block after think");
  if (const Block* b = longest_block(all_blocks, false)) return as_python(b->body, "report: plain block");
  if (has_think && !trim(after).empty()) return as_python(std::string(after), "report: text after </think>");
  return as_python(std::string(response), "report: whole response");
}

}  // namespace trex::orkit::eval
