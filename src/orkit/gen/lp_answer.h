// The LP-structure answer check shared by `trex ordata generate` and `trex ordata distill`: the answer is
// a gurobipy program that builds the model and writes it with model.write("<name>.lp") (the founding
// report's ORGEval contract). It runs in the evaluator's jail (eval::execute_python in LP-structure mode),
// and the LP file it wrote must be structurally equivalent, by the same ORGEval code `trex eval` grades
// with, to the instance's reference LP.
#pragma once
#include <map>
#include <string>

#include "orkit/eval/execute.h"

namespace trex::orkit::gen {

struct LpAnswerCheck {
  bool ok = false;
  // When !ok: "lp_answer_program" (did not run / wrote no LP file), "lp_answer_parse" (its LP file does not
  // read), "lp_answer_reference" (the reference does not read), or "lp_answer_" + the ORGEval reason
  // ("lp_answer_wl_graph_mismatch", "lp_answer_var_count_mismatch", ...).
  std::string reason;
  std::string detail;
  std::string lp_text;  // the LP file the program wrote
};

// Runs `program` (with `files` in its work directory) and compares the LP file it writes with `reference_lp`.
LpAnswerCheck check_lp_answer(const std::string& program, const std::map<std::string, std::string>& files,
                              const std::string& reference_lp, const eval::ExecConfig& config, int slot);

// Compares an LP text with the reference by ORGEval (the part of check_lp_answer after the run).
LpAnswerCheck compare_lp_answer(const std::string& answer_lp, const std::string& reference_lp);

}  // namespace trex::orkit::gen
