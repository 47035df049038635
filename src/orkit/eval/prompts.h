// Zero-shot prompt templates (paraphrased from the T-Rex harness, design/trex-report.md §1.2) for the
// answer formats `trex eval` can execute.
#pragma once
#include <string>
#include <vector>

#include "orkit/eval/benchmark.h"
#include "orkit/eval/openai_client.h"
#include "orkit/eval/protocol.h"

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
// `data_base_dir` is the Bench4Opt "File Path Base Directory" (the benchmark data directory on the
// evaluating machine). Under Protocol::Report the NL4OPT/OptiBench (Trex), B4oFeasible and OrgEval formats
// use the report's templates (design/trex-report.md §1.2): the solver targets a system + user pair, ORGEval
// one user message ending with the problem where the template's `[Problem Description]` stood. Under
// Protocol::Trex they carry T-Rex's added wording (fenced code, the `model` variable, model.write(...)).
// The other formats exist only in T-Rex's protocol and read the same under both.
std::vector<ChatMessage> build_prompt(PromptFormat f, const BenchItem& item, Protocol protocol = Protocol::Trex,
                                      const std::string& data_base_dir = "");

}  // namespace trex::orkit::eval
