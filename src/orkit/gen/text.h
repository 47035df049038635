// Small text helpers shared by the family generators and renderers: numbers as a person writes them,
// English lists, Markdown tables, identifiers that every LP/MathProg/Python reader accepts.
#pragma once
#include <string>
#include <vector>

#include "orkit/gen/instance.h"

namespace trex::orkit::gen {

std::string num(double v);                       // 12, 12.5, 0.03 (no trailing zeros, no exponent)
std::string money(double v);                     // $1,250 or $12.50
std::string with_commas(double v);               // 12,500 / 1,250.5
std::string join_and(const std::vector<std::string>& items, const std::string& conj = "and");
std::string join(const std::vector<std::string>& items, const std::string& sep);
std::string markdown_table(const Table& t);
std::string ident(const std::string& s);         // "North Dock" -> "North_Dock"
std::string capitalize(std::string s);
std::string pluralize(const std::string& noun, double count);  // "1 unit" / "2 units" (count is the number)
// Replaces {key} occurrences by values, for phrasing templates kept as data.
std::string fill(std::string text, const std::vector<std::pair<std::string, std::string>>& subs);

// Python source for a JSON value (JSON numbers, strings, lists and objects are valid Python literals).
std::string python_literal(const json& j);

}  // namespace trex::orkit::gen
