// The guard every model/benchmark parser runs first: the input must be text. A NUL byte, another control
// character (other than tab, newline, carriage return, form feed, vertical tab), DEL or a byte sequence that
// is not UTF-8 means a binary or corrupted file; the parsers were written for text and some (the LP
// tokenizer on '\0') would otherwise misread such bytes. The error names the source, line, column and
// byte offset of the first offending byte and what it is.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace trex::orkit {

struct BinaryByte {
  size_t offset = 0;  // 0-based byte offset
  int line = 1;       // 1-based
  int column = 1;     // 1-based, in bytes
  std::string what;   // "NUL byte (0x00)", "control character 0x1b", "invalid UTF-8 byte 0xff", ...
};

// The first byte that is not text, if any.
std::optional<BinaryByte> find_binary_byte(std::string_view text);

// Throws trex::Error "<source>:<line>:<column>: byte offset N: <what>; expected a text <kind>" when
// `text` is not text, or when it is longer than `max_bytes` (0: no size limit).
void require_text(std::string_view text, const std::string& source, const char* kind, size_t max_bytes = 0);

}  // namespace trex::orkit
