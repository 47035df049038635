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

// The founding report's two extraction functions (design/trex-report.md §1.4), for `--protocol report`.
// Both always return code (format Python): what the report's harness would run, even when that is prose.
// Solver targets: longest ```python block anywhere (think section included); else the longest plain
// ``` block over 50 characters, else the longest plain block; else the longest <python>...</python>
// content (the longest fenced block inside it if it has any); else the text after the last </think>
// (or </redacted_reasoning>), or a fenced block in it; else a fenced block in the think section; else the
// whole response.
ExtractedCode extract_code_report_solver(std::string_view response);
// ORGEval: the text after the last </think> is preferred: the longest ```python block there, then in the
// whole response; then the longest plain block (after-think, then whole); else the after-think text; else
// the whole response. <python> tags are not looked at.
ExtractedCode extract_code_report_orgeval(std::string_view response);
// Guesses the format of bare text (None when it does not look like any).
CodeFormat sniff_format(std::string_view text);
const char* format_name(CodeFormat f);

}  // namespace trex::orkit::eval
