#include "orkit/gen/mathprog_data.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace trex::orkit::gen {
namespace {

std::string sym(const std::string& s) {
  TREX_CHECK(s.find('\'') == std::string::npos, "MathProg symbol {} contains a quote", s);
  return "'" + s + "'";
}
std::string number(const json& v) {
  TREX_CHECK(v.is_number(), "expected a number in the data, got {}", v.dump());
  return fmt::format("{:.17g}", v.get<double>());
}

// Flattens nested objects of numbers into "'a' 'b' value" records.
void records(const json& j, const std::string& prefix, std::vector<std::string>& out, const std::string& key) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string p = prefix + sym(it.key()) + " ";
    if (it->is_object())
      records(*it, p, out, key);
    else if (it->is_number())
      out.push_back(p + number(*it));
    else
      trex::fail("data key '{}': entry '{}' is neither a number nor an object", key, it.key());
  }
}

}  // namespace

std::string write_mathprog_data(const json& data, const std::vector<std::string>& skip) {
  std::string out = "data;\n";
  for (auto it = data.begin(); it != data.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    const json& v = *it;
    if (v.is_number()) {
      out += fmt::format("param {} := {};\n", k, number(v));
    } else if (v.is_array()) {
      out += "set " + k + " :=";
      for (const auto& e : v) {
        if (e.is_string()) {
          out += " " + sym(e.get<std::string>());
        } else if (e.is_array()) {
          std::vector<std::string> parts;
          for (const auto& p : e) parts.push_back(p.is_string() ? sym(p.get<std::string>()) : number(p));
          out += " (" + fmt::format("{}", fmt::join(parts, ",")) + ")";
        } else {
          trex::fail("data key '{}': set members must be strings or tuples, got {}", k, e.dump());
        }
      }
      out += ";\n";
    } else if (v.is_object()) {
      const bool indexed_set = !v.empty() && v.begin()->is_array();
      if (indexed_set) {
        for (auto s = v.begin(); s != v.end(); ++s) {
          out += fmt::format("set {}[{}] :=", k, sym(s.key()));
          for (const auto& e : *s) out += " " + sym(e.get<std::string>());
          out += ";\n";
        }
      } else {
        std::vector<std::string> recs;
        records(v, "", recs, k);
        out += "param " + k + " :=";
        for (const auto& r : recs) out += "\n  " + r;
        out += ";\n";
      }
    } else {
      trex::fail("data key '{}' has a value MathProg cannot take: {}", k, v.dump());
    }
  }
  return out;
}

std::string mathprog_program(const Instance& inst) {
  return inst.mathprog + "\n" + write_mathprog_data(inst.data) + "end;\n";
}

}  // namespace trex::orkit::gen
