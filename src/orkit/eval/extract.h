// Finds the program in a model's answer. Fenced blocks are recognised by their language tag (python,
// lp, mps, mathprog/gmpl) or, untagged, by their content. Priority follows the T-Rex harness: the
// longest ```python block anywhere; else the longest block of another solver format; else the longest
// untagged block (preferring those over 50 characters); else <python>...</python>; else the text after
// the last </think> if it reads as code.
#pragma once
#include <string>
#include <string_view>

namespace trex::orkit::eval {

enum class CodeFormat { None, Python, Lp, Mps, MathProg };

struct ExtractedCode {
  CodeFormat format = CodeFormat::None;
  std::string code;
  std::string how;  // "fenced python block", "untagged block (content: lp)", "<python> tags", ...
};

ExtractedCode extract_code(std::string_view response);
// Guesses the format of bare text (None when it does not look like any).
CodeFormat sniff_format(std::string_view text);
const char* format_name(CodeFormat f);

}  // namespace trex::orkit::eval
