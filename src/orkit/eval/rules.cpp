#include "orkit/eval/rules.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace trex::orkit::eval {

const char* rule_name(Rule r) {
  switch (r) {
    case Rule::TrexAbsolute:
      return "trex-abs";
    case Rule::Relative:
      return "rel";
    case Rule::OrlmRounded:
      return "orlm";
    case Rule::ReSocratic:
      return "resocratic";
    case Rule::Absolute01:
      return "abs-0.1";
    case Rule::Absolute001:
      return "abs-0.01";
    case Rule::LpStructure:
      return "orgeval";
  }
  return "?";
}

std::string rule_description(Rule r) {
  switch (r) {
    case Rule::TrexAbsolute:
      return "|p-g| <= 1e-6 (T-Rex)";
    case Rule::Relative:
      return "|p-g|/(|g|+1) < 1e-6 (SIRL/OptiMind)";
    case Rule::OrlmRounded:
      return "round, then |p-g|/|g| <= 5% (ORLM)";
    case Rule::ReSocratic:
      return "every labelled value within 1e-4 (ReSocratic)";
    case Rule::Absolute01:
      return "|p-g| < 0.1 (OR-LLM-Agent)";
    case Rule::Absolute001:
      return "|p-g| < 0.01 (ORThought)";
    case Rule::LpStructure:
      return "LP-structure equivalence (ORGEval)";
  }
  return "?";
}

Rule parse_rule(const std::string& name) {
  for (Rule r : {Rule::TrexAbsolute, Rule::Relative, Rule::OrlmRounded, Rule::ReSocratic, Rule::Absolute01,
                 Rule::Absolute001, Rule::LpStructure})
    if (name == rule_name(r)) return r;
  if (name == "sirl" || name == "optimind") return Rule::Relative;
  if (name == "trex") return Rule::TrexAbsolute;
  fail(
      "unknown scoring rule \"{}\"; expected one of trex-abs, rel (= sirl, optimind), orlm, resocratic, "
      "abs-0.1, abs-0.01, orgeval",
      name);
}

Rule default_rule(const std::string& stem, bool lp_structure, const std::string& name) {
  if (lp_structure) return Rule::LpStructure;
  if (stem == "nl4opt_289" || stem == "optibench" || stem.rfind("bench4opt", 0) == 0)
    return Rule::TrexAbsolute;
  if (name == "NL4OPT-289" || name == "OptiBench" || name.rfind("B4O-", 0) == 0) return Rule::TrexAbsolute;
  return Rule::Relative;
}

bool objective_matches(Rule rule, double p, double g) {
  if (!std::isfinite(p)) return false;
  switch (rule) {
    case Rule::TrexAbsolute:
      return std::fabs(p - g) <= 1e-6;
    case Rule::Relative:
      return std::fabs(p - g) / (std::fabs(g) + 1.0) < 1e-6;
    case Rule::OrlmRounded: {
      const double rp = std::round(p), rg = std::round(g);
      if (rg == 0.0) return std::fabs(rp) <= 0.05;
      return std::fabs(rp - rg) / std::fabs(rg) <= 0.05;
    }
    case Rule::ReSocratic:
      return std::fabs(p - g) <= 1e-4;
    case Rule::Absolute01:
      return std::fabs(p - g) < 0.1;
    case Rule::Absolute001:
      return std::fabs(p - g) < 0.01;
    case Rule::LpStructure:
      fail("the orgeval rule compares LP structure, not objective values");
  }
  return false;
}

bool resocratic_matches(const nlohmann::json& expected_values, double predicted_objective,
                        const std::map<std::string, double>& predicted_values) {
  std::vector<double> pool{predicted_objective};
  for (const auto& [name, v] : predicted_values) pool.push_back(v);
  std::vector<bool> used(pool.size(), false);
  for (const auto& [label, v] : expected_values.items()) {
    double g;
    if (v.is_number()) {
      g = v.get<double>();
    } else if (v.is_string()) {
      try {
        g = std::stod(v.get<std::string>());
      } catch (const std::exception&) {
        return false;
      }
    } else {
      return false;
    }
    bool found = false;
    for (size_t i = 0; i < pool.size() && !found; ++i)
      if (!used[i] && std::fabs(pool[i] - g) <= 1e-4) used[i] = found = true;
    if (!found) return false;
  }
  return true;
}

}  // namespace trex::orkit::eval
