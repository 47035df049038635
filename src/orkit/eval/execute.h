// Executes one extracted answer in the sandbox and reports what the model it builds does: Python
// programs run against the solver look-alikes (python/trex_solvers: gurobipy, coptpy, pyscipopt, pulp),
// LP/MPS files and MathProg models go to `trex solve`. For LP-structure grading the LP file the program
// writes (any *.lp) is returned instead of a solution.
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "orkit/eval/benchmark.h"
#include "orkit/eval/extract.h"
#include "orkit/eval/sandbox.h"

namespace trex::orkit::eval {

struct ExecConfig {
  std::string python;                // interpreter; empty: /usr/bin/python3 if present, else python3 on PATH
  std::filesystem::path trex_bin;    // the trex binary (for `trex solve`)
  std::filesystem::path python_pkg;  // directory holding gurobipy.py etc.; empty: default_python_pkg()
  std::filesystem::path work_root;   // where per-item temp dirs go; empty: $TMPDIR or /tmp
  SandboxLimits limits;              // wall_seconds is the per-item timeout
  bool keep_workdirs = false;        // for debugging
};

enum class ExecStatus {
  Optimal,  // objective (and variable values) available
  Infeasible,
  Unbounded,
  InfeasibleOrUnbounded,
  SolverError,   // the solver failed or hit a limit
  ProgramError,  // the program raised / did not parse / exited non-zero
  NoModel,       // ran, but no model was found / no LP file written
  Timeout,       // wall or CPU limit
  Crashed,       // killed by a signal or output limit
  LpWritten,     // LP-structure mode: lp_text holds the program's LP file
};

struct ExecOutcome {
  ExecStatus status = ExecStatus::ProgramError;
  std::optional<double> objective;
  std::map<std::string, double> values;
  std::string lp_text;
  std::string message;  // error text / traceback tail / sandbox description
  double seconds = 0.0;
};

const char* exec_status_name(ExecStatus s);
std::filesystem::path default_python_pkg();
std::string find_python(const std::string& configured);

ExecOutcome execute_answer(const BenchItem& item, const ExtractedCode& code, GradeKind grade,
                           const ExecConfig& config, int slot);

}  // namespace trex::orkit::eval
