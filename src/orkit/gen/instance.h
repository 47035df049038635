// One generated OR problem instance, before it becomes an SFT sample: the data (as the file a program
// would read), the pieces of prose that describe it, the model built by the family's C++ builder
// (verification route 1) and the family's MathProg formulation (route 2, written independently).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "orkit/lp/model.h"

namespace trex::orkit::gen {

using json = nlohmann::ordered_json;

enum class Difficulty { Small, Medium, Large, Industrial };
enum class Expected { Optimal, Infeasible, Unbounded };

const char* difficulty_name(Difficulty d);
const char* expected_name(Expected e);
Difficulty parse_difficulty(const std::string& s);

// Data shown as a Markdown table in the "table" representation.
struct Table {
  std::string caption;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

struct Instance {
  std::string family;
  std::string problem_class;  // "LP", "MILP" or "QP"
  Difficulty difficulty = Difficulty::Small;
  Expected expected = Expected::Optimal;
  std::string status_reason;  // why the instance is infeasible / unbounded, by construction

  // Data. Keys are the parameter names used by the formulation, the Python code and the MathProg model.
  json data;
  std::vector<std::pair<std::string, std::string>> data_keys;  // key -> description (external-data tasks)

  // Prose. The story has no numbers; the numbers come from inline_data, or table_lead + tables, or the file.
  std::string story;
  std::string inline_data;
  std::string table_lead;
  std::vector<Table> tables;
  std::string question;
  std::string objective_unit;  // "dollars", "hours", ... used when explaining results

  // Route 1: the model as the family's C++ builder writes it.
  Model model;
  // Route 2: the family's MathProg model section (symbolic, no numbers); the data section is derived
  // from `data` by write_mathprog_data().
  std::string mathprog;
  // Route 2 for quadratic families (GLPK's MathProg is linear only): a second model built by separate
  // code from the data (e.g. through a factorisation), solved by Ipopt. Empty for linear families.
  std::optional<Model> route2_model;
  // Answer pieces.
  std::string reasoning;    // concise modelling analysis for <think>
  std::string formulation;  // indexed model for <model>
  std::string python_body;  // gurobipy code that uses the dict `data`; must leave the model in `model`
};

}  // namespace trex::orkit::gen
