#include "orkit/lp/text_input.h"

#include "core/error.h"

namespace trex::orkit {

namespace {

// Length of the UTF-8 sequence starting at s[i] (1..4), or 0 when it is not well-formed (overlong forms,
// surrogates and code points above U+10FFFF included).
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

}  // namespace

std::optional<BinaryByte> find_binary_byte(std::string_view text) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    std::string what;
    size_t step = 1;
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    } else if (c == 0) {
      what = "NUL byte (0x00)";
    } else if (c < 0x20 && c != '\t' && c != '\r' && c != '\f' && c != '\v') {
      what = fmt::format("control character 0x{:02x}", c);
    } else if (c == 0x7f) {
      what = "control character 0x7f (DEL)";
    } else if (c >= 0x80) {
      step = utf8_length(text, i);
      if (step == 0) what = fmt::format("invalid UTF-8 byte 0x{:02x}", c);
    }
    if (!what.empty()) return BinaryByte{i, line, static_cast<int>(i - line_start) + 1, what};
    i += step;
  }
  return std::nullopt;
}

void require_text(std::string_view text, const std::string& source, const char* kind, size_t max_bytes) {
  if (max_bytes > 0 && text.size() > max_bytes)
    fail("{}: {} bytes; a {} may have at most {} bytes", source, text.size(), kind, max_bytes);
  if (const auto bad = find_binary_byte(text))
    fail("{}:{}:{}: byte offset {}: {}; expected a text {} (is this a binary file?)", source, bad->line,
         bad->column, bad->offset, bad->what, kind);
}

}  // namespace trex::orkit
