#include "orkit/eval/prompts.h"

#include "core/error.h"

namespace trex::orkit::eval {

const char* prompt_format_name(PromptFormat f) {
  switch (f) {
    case PromptFormat::Trex:
      return "trex";
    case PromptFormat::Python:
      return "python";
    case PromptFormat::LpFile:
      return "lp";
    case PromptFormat::MathProg:
      return "mathprog";
    case PromptFormat::B4oFeasible:
      return "b4o-feasible";
    case PromptFormat::OrgEval:
      return "orgeval";
  }
  return "?";
}

PromptFormat prompt_format_for(const std::string& name, const BenchItem& item) {
  if (name == "auto" || name.empty()) {
    if (item.grade == GradeKind::LpStructure) return PromptFormat::OrgEval;
    if (!item.data.is_null()) return PromptFormat::B4oFeasible;
    return PromptFormat::Trex;
  }
  for (PromptFormat f : {PromptFormat::Trex, PromptFormat::Python, PromptFormat::LpFile,
                         PromptFormat::MathProg, PromptFormat::B4oFeasible, PromptFormat::OrgEval})
    if (name == prompt_format_name(f)) return f;
  fail("unknown prompt format \"{}\"; expected auto, trex, python, lp, mathprog, b4o-feasible or orgeval",
       name);
}

namespace {

// The Bench4Opt data block both protocols share: the dataset path, the base directory, the rules.
std::string b4o_data_description(const BenchItem& item, const std::string& base_dir) {
  return "## Data Description\nThe original dataset file for this instance is `" + item.data_path +
         "`. During evaluation, the instance data will be provided as a JSON file named `data.json` in the "
         "working directory.\n\n### File Path Base Directory\n" +
         (base_dir.empty() ? std::string(".") : base_dir) +
         "\n\nCritical instructions: read the data from a file named `data.json`; do not use absolute paths "
         "or `./`-prefixed paths for it; do not rely on any other file.\n\n";
}

std::vector<ChatMessage> report_prompt(PromptFormat f, const BenchItem& item, const std::string& base_dir) {
  const std::string& q = item.question;
  switch (f) {
    case PromptFormat::Trex:
      return {{"system",
               "You are a helpful assistant with expertise in operations research and the Gurobi solver. When "
               "given an operations research question, analyze it, build a detailed mathematical model, and "
               "provide Gurobi code compatible with gurobipy 12.x to solve it. Your response must follow these "
               "three steps, each enclosed in its tags, in Markdown format:\n"
               "1. <think> Analyze the problem to identify the decision variables, the objective and the "
               "constraints. </think>\n"
               "2. <model> The complete mathematical model, including Sets, Parameters, Decision Variables "
               "(with their types), Objective Function and Constraints. </model>\n"
               "3. <python> The corresponding Gurobi Python code. </python>"},
              {"user", "Answer the following mathematical modeling question:\n" + q + "\nPlease think step by step."}};
    case PromptFormat::B4oFeasible:
      return {{"system",
               "You are a professional mathematical optimization expert. Use Python and gurobipy compatible "
               "with Gurobi 12.x to solve the problem."},
              {"user",
               "## Problem Description\n" + q + "\n\n" + b4o_data_description(item, base_dir) +
                   "## Requirements\n"
                   "1. Formulate the optimization model and write the code.\n"
                   "2. Use gurobipy (Gurobi 12.x).\n"
                   "3. Use only the parameters given in the problem statement and in data.json.\n"
                   "4. Define the final model in a variable named `model`.\n"
                   "5. Specify upper and lower bounds for all variables.\n"
                   "6. Pay attention to data types and dimensions.\n"
                   "7. Derive any helper quantity explicitly.\n"
                   "8. Use Gurobi 12.x compatible syntax, and pass constraint names with the `name=` keyword, "
                   "not positionally.\n"
                   "9. Output Python code only.\n\n"
                   "## Output Format\n```python\nimport json\nimport gurobipy as gp\nfrom gurobipy import GRB\n\n"
                   "with open(\"data.json\", \"r\") as f:\n    data = json.load(f)\n\nmodel = gp.Model(\"model\")\n"
                   "# variables, objective and constraints\nmodel.optimize()\n\n"
                   "# optional\nif model.Status == GRB.OPTIMAL:\n    print(f\"optimal_value = {model.ObjVal}\")\n"
                   "elif model.Status == GRB.INFEASIBLE:\n    print(\"INFEASIBLE\")\n"
                   "elif model.Status == GRB.UNBOUNDED:\n    print(\"UNBOUNDED\")\nelse:\n    print(\"ERROR\")\n```\n"
                   "Do not use `if __name__ == \"__main__\":` and do not wrap the code in functions."}};
    case PromptFormat::OrgEval:
      return {{"user",
               "You are an expert in optimization modeling and gurobipy. Please build a model for the following "
               "problem and implement it with the installed gurobipy (Gurobi 12.x).\nRequirements:\n"
               "1. Do not optimize or solve the model; save the model as an `.lp` file.\n"
               "2. Specify upper and lower bounds for all variables.\n"
               "3. Pay attention to data types and dimensions.\n"
               "4. Do not use any parameter that is not in the data file; define any additional parameter "
               "clearly.\n"
               "5. Output Python code only.\n"
               "6. The code must run directly and save the desired `.lp` file.\n\n" +
                   q}};
    default:
      return {};
  }
}

}  // namespace

std::vector<ChatMessage> build_prompt(PromptFormat f, const BenchItem& item, Protocol protocol,
                                      const std::string& data_base_dir) {
  const std::string& q = item.question;
  if (protocol == Protocol::Report) {
    auto msgs = report_prompt(f, item, data_base_dir);
    if (!msgs.empty()) return msgs;
  }
  switch (f) {
    case PromptFormat::Trex:
      return {
          {"system",
           "You are a helpful assistant with expertise in operations research and the Gurobi solver. When "
           "given an operations research question, analyse it, build a detailed mathematical model and give "
           "Gurobi code (compatible with gurobipy 12.x) that solves it. Answer in Markdown in three steps, "
           "each "
           "enclosed in its tags:\n"
           "1. <think> Analyse the problem: identify the decision variables, the objective and the "
           "constraints. </think>\n"
           "2. <model> The complete mathematical model: Sets, Parameters, Decision Variables (with their "
           "types), Objective Function, Constraints. </model>\n"
           "3. <python> The corresponding gurobipy code in a ```python block; the model must be in a "
           "variable "
           "named `model`. </python>"},
          {"user",
           "Answer the following mathematical modeling question:\n" + q + "\nPlease think step by step."}};
    case PromptFormat::Python:
      return {{"system",
               "You are an expert in optimisation modelling. Write a complete Python program that models and "
               "solves "
               "the problem with gurobipy (pulp, pyscipopt or coptpy are also accepted). Keep the model in a "
               "global "
               "variable named `model`, call model.optimize(), and give the program in one ```python block."},
              {"user", q}};
    case PromptFormat::LpFile:
      return {{"system",
               "You are an expert in optimisation modelling. Formulate the problem and write the model as a "
               "CPLEX LP "
               "file (Minimize/Maximize, Subject To, Bounds, Generals/Binaries, End) with every number "
               "written out. "
               "Give the file in one ```lp block."},
              {"user", q}};
    case PromptFormat::MathProg:
      return {{"system",
               "You are an expert in optimisation modelling. Formulate the problem as a GNU MathProg (GMPL) "
               "model "
               "with its data, ending with `solve;` and `end;`, in one ```mathprog block."},
              {"user", q}};
    case PromptFormat::B4oFeasible:
      return {
          {"system",
           "You are a professional mathematical optimisation expert. Solve the problem with Python and "
           "gurobipy "
           "(compatible with Gurobi 12.x)."},
          {"user",
           "## Problem Description\n" + q +
               "\n\n" + b4o_data_description(item, data_base_dir) +
               "## Requirements\n"
               "1. Formulate the optimisation model and write the code that solves it.\n"
               "2. Use gurobipy (Gurobi 12.x).\n"
               "3. Use only the parameters in the problem statement and in data.json.\n"
               "4. Define the final model in a variable named `model`.\n"
               "5. Give lower and upper bounds for every variable.\n"
               "6. Take care with data types and dimensions.\n"
               "7. Derive any helper quantity explicitly.\n"
               "8. Use Gurobi 12.x syntax; pass constraint names with the `name=` keyword.\n"
               "9. Output Python code only.\n\n"
               "## Output Format\n```python\nimport json\nimport gurobipy as gp\nfrom gurobipy import GRB\n\n"
               "with open(\"data.json\") as f:\n    data = json.load(f)\nmodel = gp.Model(\"model\")\n"
               "# variables, objective, constraints\nmodel.optimize()\n"
               "if model.Status == GRB.OPTIMAL:\n    print(\"optimal_value =\", model.ObjVal)\n"
               "elif model.Status == GRB.INFEASIBLE:\n    print(\"INFEASIBLE\")\n"
               "elif model.Status == GRB.UNBOUNDED:\n    print(\"UNBOUNDED\")\nelse:\n    "
               "print(\"ERROR\")\n```\n"
               "Do not use `if __name__ == \"__main__\":` and do not wrap the code in functions."}};
    case PromptFormat::OrgEval:
      return {{"user",
               "You are an expert in optimisation modelling and gurobipy. Build the model for the problem "
               "below and "
               "implement it with the installed gurobipy (Gurobi 12.x).\nRequirements:\n"
               "1. Do not optimise or solve the model; save it as an `.lp` file with model.write(...).\n"
               "2. Give lower and upper bounds for every variable.\n"
               "3. Take care with data types and dimensions.\n"
               "4. Use no parameter that is not in the data file; define any extra one clearly.\n"
               "5. Output Python code only.\n"
               "6. The code must run directly and save the `.lp` file.\n\n" +
                   q}};
  }
  return {};
}

}  // namespace trex::orkit::eval
