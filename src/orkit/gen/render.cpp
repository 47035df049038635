#include "orkit/gen/render.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "orkit/gen/attach_csv.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {

const char* category_name(Category c) {
  switch (c) {
    case Category::Formulation: return "formulation";
    case Category::SolverCode: return "solver_code";
    case Category::ExternalData: return "external_data";
    case Category::LpStructure: return "lp_structure";
  }
  return "?";
}
const char* representation_name(Representation r) {
  switch (r) {
    case Representation::Inline: return "inline";
    case Representation::Table: return "table";
    case Representation::Attached: return "attached";
  }
  return "?";
}
Category parse_category(const std::string& s) {
  for (Category c : {Category::Formulation, Category::SolverCode, Category::ExternalData, Category::LpStructure})
    if (s == category_name(c)) return c;
  trex::fail("unknown task category '{}' (expected formulation, solver_code, external_data or lp_structure)", s);
}
Representation parse_representation(const std::string& s) {
  for (Representation r : {Representation::Inline, Representation::Table, Representation::Attached})
    if (s == representation_name(r)) return r;
  trex::fail("unknown representation '{}' (expected inline, table or attached)", s);
}

const char* attach_format_name(AttachFormat f) { return f == AttachFormat::Csv ? "csv" : "json"; }

namespace {

// The system prompt of the NL4OPT / OptiBench evaluation contract (report 1.2).
const char* kSolverSystem =
    "You are a helpful assistant with expertise in operations research and the Gurobi solver. Given an "
    "operations research question, analyse it, build a detailed mathematical model and give Gurobi Python code "
    "compatible with gurobipy 12.x. Follow three steps, each enclosed in tags, in Markdown: (1) <think> analyse "
    "the problem to identify decision variables, objective and constraints </think>; (2) <model> the complete "
    "model with Sets, Parameters, Decision Variables (with types), Objective Function and Constraints </model>; "
    "(3) <python> the corresponding Gurobi Python code </python>.";

// The B4O-Feasible contract (report 1.2): data comes from data.json, the model lives in `model`.
const char* kExternalSystem =
    "You are a professional mathematical optimisation expert. Use Python and gurobipy (compatible with Gurobi "
    "12.x) to solve the problem.";

std::string file_block(const Instance& inst, AttachFormat attach) {
  if (attach == AttachFormat::Csv) {
    std::string s = "The following structured data files are provided:\n";
    for (const auto& f : csv_files(inst)) s += "\n### " + f.name + "\n```csv\n" + f.text + "```\n";
    return s;
  }
  return "The following structured data files are provided:\n\n### data.json\n```json\n" + inst.data.dump(2) +
         "\n```\n";
}

std::string external_prompt(const Instance& inst, AttachFormat attach) {
  std::string keys, where;
  if (attach == AttachFormat::Csv) {
    for (const auto& f : csv_files(inst)) keys += fmt::format("- `{}`: {}\n", f.name, f.description);
    where = "The instance data are provided as CSV files (comma-separated, one header row) in the working "
            "directory:\n" + keys + "\nCritical instructions: read the data from these files by their bare names; do "
            "not use absolute or `./` paths; do not rely on other files.";
  } else {
    for (const auto& [k, v] : inst.data_keys) keys += fmt::format("- `{}`: {}\n", k, v);
    where = "The instance data are provided as a JSON file named `data.json` in the working directory, with these "
            "keys:\n" + keys + "\nCritical instructions: read the data from a file named `data.json`; do not use "
            "absolute or `./` paths for it; do not rely on other files.";
  }
  return fmt::format(
      "## Problem Description\n{}\n\n{}\n\n## Data Description\n{}\n\n## Requirements\n"
      "1. Formulate the model and write the code.\n2. Use gurobipy (Gurobi 12.x).\n"
      "3. Use only the parameters in the statement and in the data {}.\n"
      "4. Define the final model in a variable named `model`.\n"
      "5. Give lower and upper bounds for all variables.\n"
      "6. Pass constraint names with the `name=` keyword.\n"
      "7. After optimising, print `optimal_value = <value>`, or INFEASIBLE / UNBOUNDED / ERROR by status.",
      inst.story, inst.question, where, attach == AttachFormat::Csv ? "files" : "file");
}

const std::vector<std::string> kFormulationAsks = {
    "Formulate a mathematical optimisation model for the following problem, state its sets, parameters, "
    "variables, objective and constraints, and implement it in gurobipy.",
    "Write the mathematical programming formulation of this problem and the Gurobi Python code that solves it.",
    "Build an optimisation model for the situation below (define variables with their types, the objective and "
    "every constraint), then give gurobipy code.",
    "Model the following decision problem as a mathematical program and provide solver code.",
};
// The LP-structure asks: the answer is the report's ORGEval contract, a gurobipy program that builds the
// model and writes it as an LP file (lp_file_name) instead of solving it.
const std::vector<std::string> kLpAsks = {
    "Write gurobipy code that builds the optimisation model of the following problem and writes it to the LP "
    "file {} with model.write. Do not solve it.",
    "Give Gurobi Python code for the model of this problem that saves the model as {} (model.write); do not "
    "call optimize.",
    "Build the following optimisation problem in gurobipy and export it with model.write(\"{}\").",
};

std::string status_note(const Instance& inst) {
  if (inst.expected == Expected::Infeasible)
    return "\n- Check of the data: " + inst.status_reason + ", so the model has no feasible solution; the code "
           "reports the solver status instead of a value.";
  if (inst.expected == Expected::Unbounded)
    return "\n- Check of the data: " + inst.status_reason + "; the solver will report the model as unbounded.";
  return "";
}

}  // namespace

std::string problem_statement(const Instance& inst, Representation rep, bool hide_numbers, AttachFormat attach) {
  std::string s = inst.story + "\n\n";
  switch (rep) {
    case Representation::Inline: s += inst.inline_data + "\n\n"; break;
    case Representation::Table:
      if (!inst.table_lead.empty()) s += inst.table_lead + "\n\n";
      for (const auto& t : inst.tables) s += markdown_table(t) + "\n";
      break;
    case Representation::Attached:
      if (!hide_numbers) s += file_block(inst, attach) + "\n";
      break;
  }
  return s + inst.question;
}

namespace {

// Imports and the data (literal, data.json or the CSV files) that precede the family's body.
std::string program_head(const Instance& inst, Representation rep, AttachFormat attach) {
  std::string code = "import json\nimport gurobipy as gp\nfrom gurobipy import GRB\n\n";
  if (rep == Representation::Attached && attach == AttachFormat::Csv)
    code = "import gurobipy as gp\nfrom gurobipy import GRB\n" + csv_loader_python(inst.data) + "\n";
  else if (rep == Representation::Attached)
    code += "with open(\"data.json\") as f:\n    data = json.load(f)\n\n";
  else
    code += "# Data from the problem statement.\ndata = " + python_literal(inst.data) + "\n\n";
  return code;
}

}  // namespace

std::string python_program(const Instance& inst, Representation rep, AttachFormat attach) {
  std::string code = program_head(inst, rep, attach);
  code += inst.python_body;
  code +=
      "\nif model.Status == GRB.OPTIMAL:\n    print(f\"optimal_value = {model.ObjVal}\")\n"
      "elif model.Status == GRB.INFEASIBLE:\n    print(\"INFEASIBLE\")\n"
      "elif model.Status in (GRB.UNBOUNDED, GRB.INF_OR_UNBD):\n    print(\"UNBOUNDED\")\nelse:\n    print(\"ERROR\")\n";
  return code;
}

std::string lp_file_name(const Instance& inst) {
  std::string name;
  for (char c : inst.family) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return (name.empty() ? std::string("model") : name) + ".lp";
}

std::string lp_writer_program(const Instance& inst, Representation rep, AttachFormat attach) {
  // Every family's body ends by solving; the LP-structure answer writes the model instead.
  static const std::string kSolve = "model.optimize()\n";
  const std::string& body = inst.python_body;
  TREX_CHECK(body.size() >= kSolve.size() && body.compare(body.size() - kSolve.size(), kSolve.size(), kSolve) == 0,
             "family {}: its Python body does not end with model.optimize(), so it cannot become an LP writer",
             inst.family);
  return program_head(inst, rep, attach) + body.substr(0, body.size() - kSolve.size()) + "model.write(\"" +
         lp_file_name(inst) + "\")\n";
}

std::string explicit_algebra(const Model& m, size_t max_terms) {
  size_t terms = m.objective.size() + m.objective_quad.size();
  for (const auto& r : m.rows) terms += r.lin.size() + r.quad.size();
  if (terms > max_terms) return "";
  auto lin = [&](const std::vector<LinTerm>& t, const std::vector<QuadTerm>& q) {
    std::string s;
    for (const auto& x : t) {
      const double c = x.coef;
      s += s.empty() ? (c < 0 ? "-" : "") : (c < 0 ? " - " : " + ");
      if (std::fabs(c) != 1.0) s += num(std::fabs(c)) + " ";
      s += m.vars[x.var].name;
    }
    for (const auto& x : q) {
      const double c = x.coef;
      s += s.empty() ? (c < 0 ? "-" : "") : (c < 0 ? " - " : " + ");
      if (std::fabs(c) != 1.0) s += num(std::fabs(c)) + " ";
      s += x.i == x.j ? m.vars[x.i].name + "^2" : m.vars[x.i].name + " * " + m.vars[x.j].name;
    }
    return s.empty() ? std::string("0") : s;
  };
  std::string out = (m.sense == Sense::Maximize ? "maximize " : "minimize ") + lin(m.objective, m.objective_quad);
  if (m.objective_constant != 0) out += (m.objective_constant < 0 ? " - " : " + ") + num(std::fabs(m.objective_constant));
  out += "\nsubject to\n";
  for (const auto& r : m.rows)
    out += "  " + r.name + ": " + lin(r.lin, r.quad) +
           (r.sense == RowSense::LE ? " <= " : r.sense == RowSense::GE ? " >= " : " = ") + num(r.rhs) + "\n";
  std::vector<std::string> cont, ints, bins, other;
  for (const auto& v : m.vars) {
    const bool default_bounds = v.lb == 0 && v.ub == kInf;
    if (v.type == VarType::Binary) bins.push_back(v.name);
    else if (!default_bounds) other.push_back(fmt::format("{} <= {} <= {}", v.lb == -kInf ? "-inf" : num(v.lb), v.name, v.ub == kInf ? "inf" : num(v.ub)));
    if (v.type == VarType::Integer) ints.push_back(v.name);
    if (v.type != VarType::Binary && default_bounds) cont.push_back(v.name);
  }
  if (!cont.empty()) out += "  " + join(cont, ", ") + " >= 0\n";
  for (const auto& o : other) out += "  " + o + "\n";
  if (!ints.empty()) out += "  integer: " + join(ints, ", ") + "\n";
  if (!bins.empty()) out += "  binary: " + join(bins, ", ") + "\n";
  return out;
}

Rendered render(const Instance& inst, Category cat, Representation rep, Rng& rng,
                AttachFormat attach) {
  Rendered out;
  out.files = json::object();
  json msgs = json::array();
  auto add = [&](const char* role, const std::string& content) { msgs.push_back({{"role", role}, {"content", content}}); };
  const std::string think = inst.reasoning + status_note(inst);
  switch (cat) {
    case Category::Formulation: {
      add("system", kSolverSystem);
      add("user", rng.pick(kFormulationAsks) + "\n\n" + problem_statement(inst, rep, false, attach));
      std::string model = inst.formulation;
      const std::string alg = explicit_algebra(inst.model, 120);
      if (!alg.empty()) model += "\n\nWith the data of this instance:\n" + alg;
      add("assistant", "<think>\n" + think + "\n</think>\n<model>\n" + model + "\n</model>\n<python>\n" +
                           python_program(inst, rep, attach) + "</python>");
      break;
    }
    case Category::SolverCode:
      add("system", kSolverSystem);
      add("user", "Answer the following mathematical modeling question:\n" + problem_statement(inst, rep, false, attach) +
                      "\nPlease think step by step.");
      add("assistant", "<think>\n" + think + "\n</think>\n<model>\n" + inst.formulation + "\n</model>\n<python>\n" +
                           python_program(inst, rep, attach) + "</python>");
      break;
    case Category::ExternalData:
      TREX_CHECK(rep == Representation::Attached, "external-data tasks need the attached representation");
      add("system", kExternalSystem);
      add("user", external_prompt(inst, attach));
      add("assistant", "<think>\n" + think + "\n</think>\n<model>\n" + inst.formulation + "\n</model>\n<python>\n" +
                           python_program(inst, Representation::Attached, attach) + "</python>");
      break;
    case Category::LpStructure:
      add("system", kSolverSystem);
      add("user", fmt::format(fmt::runtime(rng.pick(kLpAsks)), lp_file_name(inst)) + "\n\n" +
                      problem_statement(inst, rep, false, attach));
      add("assistant", "<think>\n" + think + "\n</think>\n<model>\n" + inst.formulation + "\n</model>\n<python>\n" +
                           lp_writer_program(inst, rep, attach) + "</python>");
      break;
  }
  if (rep == Representation::Attached && attach == AttachFormat::Csv) {
    for (const auto& f : csv_files(inst)) out.files[f.name] = f.text;
  } else if (rep == Representation::Attached) {
    out.files["data.json"] = inst.data.dump(2);
  }
  out.messages = std::move(msgs);
  return out;
}

}  // namespace trex::orkit::gen
