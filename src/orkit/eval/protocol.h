// Evaluation protocols. `trex` (the default) is T-Rex's own corrected protocol: its prompts, the
// multi-format extraction of extract.h (Python, LP, MPS, MathProg), and the look-alikes' lenient model
// lookup. `report` reproduces the founding report's harness (design/trex-report.md §1.2-1.6) with its
// quirks: its prompts, its two extraction functions, and the text rewrites its harness applies to the
// code before running it. The report protocol is applied as a transformation of each answer into the
// one Python program the report's harness would run (given to the runner as a ```python block), so
// the jail, the verdict and the grading rules are the same for both protocols. docs/eval.md lists the
// differences.
#pragma once
#include <map>
#include <string>

#include "orkit/eval/benchmark.h"

namespace trex::orkit::eval {

enum class Protocol { Trex, Report };

const char* protocol_name(Protocol p);       // "trex", "report"
Protocol parse_protocol(const std::string& name);  // throws trex::Error naming the choices

// The program the report's harness runs for `response` to `item`:
//  solver targets: extraction (extract_code_report_solver); `import gurobipy as gp` / `import json`
//    prepended when absent; every "data.json" substring replaced by the data file's absolute path; an
//    exception or sys.exit ends the run as a failure; the objective is that of the global `model`,
//    else `m`, only when it has optimize() (else no model: a failure).
//  ORGEval: extraction (extract_code_report_orgeval); `from gurobipy import GRB` prepended, the imports
//    as above; "data.json" replaced by a relative path `lp_data/<data file name>`; every
//    `model.write(...)` / `m.write(...)` whose argument has no ')' rewritten to the harness's LP path
//    (so `write(os.path.join(...))` becomes a syntax error), `model.write(path)` (or `m.write` when the
//    code calls m.addVar(s)) appended when there is none; one-line `model.addVars(...)` calls without
//    `lb=` get `lb=-GRB.INFINITY`; optimize() calls are kept; an exception ends the run as a failure.
std::string report_program(const BenchItem& item, const std::string& response);

// The regex rewrites of the report's ORGEval harness alone (no imports, no wrapper), exposed for tests.
std::string report_orgeval_rewrites(const std::string& code, const std::string& lp_path,
                                    const std::string& data_path);

// Answers as the runner should see them under `protocol`: unchanged for trex; for report every answer
// becomes a ```python block holding report_program(). Items without an answer stay without one.
std::map<std::string, std::string> apply_protocol(Protocol protocol, const Benchmark& bench,
                                                  const std::map<std::string, std::string>& responses);

}  // namespace trex::orkit::eval
