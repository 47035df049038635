// Answer-matching rules of the published OR-benchmark evaluations (benchmarks/README.md). A score is
// only comparable with another computed under the same rule, so the rule is always printed with it.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace trex::orkit::eval {

enum class Rule {
  TrexAbsolute,  // "trex-abs": |p - g| <= 1e-6 (SLAI T-Rex)
  Relative,      // "rel": |p - g| / (|g| + 1) < 1e-6 (SIRL, OptiMind, OptMATH as cited by SIRL)
  OrlmRounded,   // "orlm": round both to integers, then |p - g| / |g| <= 0.05 (|p| <= 0.05 when g = 0)
  ReSocratic,    // "resocratic": every labelled value (variables and objective) within 1e-4 absolute
  Absolute01,    // "abs-0.1": |p - g| < 0.1 (OR-LLM-Agent, BWOR)
  Absolute001,   // "abs-0.01": |p - g| < 0.01 (ORThought)
  LpStructure,   // "orgeval": structural LP equivalence (Bench4Opt-ORGEval), no number compared
};

const char* rule_name(Rule r);
std::string rule_description(Rule r);      // the formula, for tables and reports
Rule parse_rule(const std::string& name);  // throws trex::Error listing the valid names
// The rule a benchmark file is conventionally reported under: T-Rex's absolute rule for the four sets of
// the founding report (NL4OPT-289, OptiBench, both Bench4Opt), the strict relative rule elsewhere.
// Recognised by the file stem or by the items' benchmark name ("NL4OPT-289", "OptiBench", "B4O-...").
Rule default_rule(const std::string& benchmark_file_stem, bool lp_structure,
                  const std::string& benchmark_name = "");

// Objective comparison under `rule` (not LpStructure). For ReSocratic, `expected_values` holds the
// labelled values (name -> number or numeric string) and `predicted_values` the program's variable values;
// every label must be matched by a distinct predicted value (objective included) within 1e-4.
bool objective_matches(Rule rule, double predicted, double expected);
bool resocratic_matches(const nlohmann::json& expected_values, double predicted_objective,
                        const std::map<std::string, double>& predicted_values);

}  // namespace trex::orkit::eval
