// Unicode general categories and UTF-8 decoding for the tokenizer. Bytes that are not valid UTF-8 decode
// to kInvalidBase + byte, a value outside Unicode that belongs to no category (so it matches only negated
// classes in a pre-tokenizer regex) and still encodes back to its original byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trex::unicode {

enum class Cat : uint8_t {
  Cn = 0,  // unassigned (and invalid bytes)
  Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe, Pi, Pf, Po, Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co
};

struct CategoryRange {
  char32_t first, last;
  Cat cat;
};
extern const CategoryRange kCategoryRanges[];
extern const size_t kCategoryRangeCount;

constexpr char32_t kInvalidBase = 0x110000;

Cat category(char32_t cp);
bool is_white_space(char32_t cp);  // the White_Space property (what \s matches)

// Major-class bitmask: bit (1 << major) with majors L=0, M=1, N=2, P=3, S=4, Z=5, C=6.
int major_of(Cat c);

// Decodes UTF-8 into code points; `offsets[i]` is the byte offset of cps[i] (offsets.back() == size).
void decode_utf8(std::string_view s, std::vector<char32_t>& cps, std::vector<uint32_t>& offsets);
void append_utf8(std::string& out, char32_t cp);  // invalid-byte code points append their raw byte

}  // namespace trex::unicode
