#include "data/unicode.h"

#include <algorithm>

namespace trex::unicode {

Cat category(char32_t cp) {
  if (cp < 0x80) {
    // ASCII fast path through the same table (first ranges are ASCII and short).
  }
  const CategoryRange* begin = kCategoryRanges;
  const CategoryRange* end = kCategoryRanges + kCategoryRangeCount;
  auto it = std::upper_bound(begin, end, cp, [](char32_t v, const CategoryRange& r) { return v < r.first; });
  if (it == begin) return Cat::Cn;
  --it;
  return cp <= it->last ? it->cat : Cat::Cn;
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int major_of(Cat c) {
  switch (c) {
    case Cat::Lu: case Cat::Ll: case Cat::Lt: case Cat::Lm: case Cat::Lo: return 0;
    case Cat::Mn: case Cat::Mc: case Cat::Me: return 1;
    case Cat::Nd: case Cat::Nl: case Cat::No: return 2;
    case Cat::Pc: case Cat::Pd: case Cat::Ps: case Cat::Pe: case Cat::Pi: case Cat::Pf: case Cat::Po: return 3;
    case Cat::Sm: case Cat::Sc: case Cat::Sk: case Cat::So: return 4;
    case Cat::Zs: case Cat::Zl: case Cat::Zp: return 5;
    case Cat::Cc: case Cat::Cf: case Cat::Cs: case Cat::Co: return 6;
    case Cat::Cn: return 7;
  }
  return 7;
}

void decode_utf8(std::string_view s, std::vector<char32_t>& cps, std::vector<uint32_t>& offsets) {
  cps.clear();
  offsets.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    offsets.push_back(uint32_t(i));
    if (c < 0x80) {
      cps.push_back(c);
      ++i;
      continue;
    }
    int len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    char32_t cp = len == 4 ? c & 0x07 : len == 3 ? c & 0x0F : c & 0x1F;
    bool ok = len > 0 && i + size_t(len) <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((p[i + size_t(k)] & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + size_t(k)] & 0x3F);
    }
    // Reject overlongs, surrogates and values past U+10FFFF.
    if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (!ok) {
      cps.push_back(kInvalidBase + c);
      ++i;
    } else {
      cps.push_back(cp);
      i += size_t(len);
    }
  }
  offsets.push_back(uint32_t(n));
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= kInvalidBase) {
    out.push_back(char(cp - kInvalidBase));
  } else if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace trex::unicode
