#include "orkit/gen/text.h"

#include <cctype>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace trex::orkit::gen {

std::string num(double v) {
  if (std::fabs(v - std::round(v)) < 1e-9) return fmt::format("{}", static_cast<long long>(std::llround(v)));
  std::string s = fmt::format("{:.6f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string with_commas(double v) {
  std::string s = num(std::fabs(v));
  const auto dot = s.find('.');
  std::string whole = s.substr(0, dot), frac = dot == std::string::npos ? "" : s.substr(dot);
  std::string out;
  for (size_t i = 0; i < whole.size(); ++i) {
    if (i > 0 && (whole.size() - i) % 3 == 0) out += ',';
    out += whole[i];
  }
  return (v < 0 ? "-" : "") + out + frac;
}

std::string money(double v) {
  const bool cents = std::fabs(v - std::round(v)) > 1e-9;
  std::string s = cents ? fmt::format("{:.2f}", std::fabs(v)) : num(std::fabs(v));
  const auto dot = s.find('.');
  std::string whole = s.substr(0, dot), frac = dot == std::string::npos ? "" : s.substr(dot);
  std::string out;
  for (size_t i = 0; i < whole.size(); ++i) {
    if (i > 0 && (whole.size() - i) % 3 == 0) out += ',';
    out += whole[i];
  }
  return (v < 0 ? "-$" : "$") + out + frac;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string join_and(const std::vector<std::string>& items, const std::string& conj) {
  if (items.empty()) return "";
  if (items.size() == 1) return items[0];
  if (items.size() == 2) return items[0] + " " + conj + " " + items[1];
  std::string out;
  for (size_t i = 0; i + 1 < items.size(); ++i) out += items[i] + ", ";
  return out + conj + " " + items.back();
}

std::string markdown_table(const Table& t) {
  std::string out;
  if (!t.caption.empty()) out += t.caption + "\n\n";
  out += "| " + join(t.header, " | ") + " |\n|";
  for (size_t i = 0; i < t.header.size(); ++i) out += i == 0 ? "---|" : "---:|";
  out += "\n";
  for (const auto& r : t.rows) out += "| " + join(r, " | ") + " |\n";
  return out;
}

std::string ident(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "n" + out;
  return out;
}

std::string capitalize(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string pluralize(const std::string& noun, double count) {
  if (std::fabs(count - 1.0) < 1e-12 || noun.empty()) return num(count) + " " + noun;
  std::string p = noun;
  if (p.back() == 'y' && p.size() > 1 && !std::strchr("aeiou", p[p.size() - 2])) {
    p.back() = 'i';
    p += "es";
  } else if (p.back() == 's' || p.back() == 'x' || p.ends_with("ch") || p.ends_with("sh")) {
    p += "es";
  } else {
    p += "s";
  }
  return num(count) + " " + p;
}

std::string fill(std::string text, const std::vector<std::pair<std::string, std::string>>& subs) {
  for (const auto& [k, v] : subs) {
    const std::string key = "{" + k + "}";
    for (size_t pos = text.find(key); pos != std::string::npos; pos = text.find(key, pos + v.size()))
      text.replace(pos, key.size(), v);
  }
  return text;
}

std::string python_literal(const json& j) { return j.dump(); }

}  // namespace trex::orkit::gen
