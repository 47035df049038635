#include "orkit/gen/lp_answer.h"

#include <fmt/format.h>

#include "orkit/eval/orgeval.h"
#include "orkit/lp/lp_format.h"

namespace trex::orkit::gen {

LpAnswerCheck compare_lp_answer(const std::string& answer_lp, const std::string& reference_lp) {
  LpAnswerCheck out;
  out.lp_text = answer_lp;
  Model ref, cand;
  try {
    ref = read_lp(reference_lp, "<reference lp>");
  } catch (const std::exception& e) {
    out.reason = "lp_answer_reference";
    out.detail = e.what();
    return out;
  }
  try {
    cand = read_lp(answer_lp, "<answer lp>");
  } catch (const std::exception& e) {
    out.reason = "lp_answer_parse";
    out.detail = e.what();
    return out;
  }
  const eval::EquivalenceVerdict v = eval::check_lp_equivalence(ref, cand);
  out.ok = v.equivalent;
  if (!v.equivalent) {
    out.reason = "lp_answer_" + v.reason;
    out.detail = fmt::format("ORGEval {}: reference {} vars / {} rows, answer {} vars / {} rows (after normalisation)",
                             v.reason, v.reference_vars, v.reference_rows, v.candidate_vars, v.candidate_rows);
  }
  return out;
}

LpAnswerCheck check_lp_answer(const std::string& program, const std::map<std::string, std::string>& files,
                              const std::string& reference_lp, const eval::ExecConfig& config, int slot) {
  const eval::ExecOutcome r = eval::execute_python(program, files, eval::GradeKind::LpStructure, config, slot);
  if (r.status != eval::ExecStatus::LpWritten) {
    LpAnswerCheck out;
    out.reason = "lp_answer_program";
    out.detail = fmt::format("the program ended {}: {}", eval::exec_status_name(r.status), r.message);
    return out;
  }
  return compare_lp_answer(r.lp_text, reference_lp);
}

}  // namespace trex::orkit::gen
