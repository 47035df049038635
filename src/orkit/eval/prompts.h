// Zero-shot prompt templates (paraphrased from the T-Rex harness, design/trex-report.md §1.2) for the
// answer formats `trex eval` can execute.
#pragma once
#include <string>
#include <vector>

#include "orkit/eval/benchmark.h"
#include "orkit/eval/openai_client.h"

namespace trex::orkit::eval {

enum class PromptFormat {
  Trex,         // <think>/<model>/<python> with Gurobi-style Python (NL4OPT, OptiBench, ...)
  Python,       // plain Python with gurobipy (or pulp / pyscipopt / coptpy)
  LpFile,       // the model as a CPLEX LP file
  MathProg,     // GNU MathProg
  B4oFeasible,  // Bench4Opt with data.json, Gurobi-style Python, `model` variable
  OrgEval,      // Bench4Opt-ORGEval: Python that writes the model as an .lp file (single user message)
};

const char* prompt_format_name(PromptFormat f);
// "auto" picks per item: ORGEval items -> OrgEval, items with data -> B4oFeasible, else Trex.
PromptFormat prompt_format_for(const std::string& name, const BenchItem& item);
std::vector<ChatMessage> build_prompt(PromptFormat f, const BenchItem& item);

}  // namespace trex::orkit::eval
