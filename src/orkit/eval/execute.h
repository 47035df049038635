// Executes one extracted answer and reports what the model it builds does. A Python program runs in the jail
// (sandbox.h) against the solver look-alikes (python/trex_solvers: gurobipy, coptpy, pyscipopt, pulp), which
// leave its model as an LP file under a fixed name in its work directory. After the jail is gone the harness
// reads that file (by name, size-limited) and solves it itself with `trex solve` in a fresh jail holding only
// that file, so the status and objective come from the project's solvers, never from anything the program
// prints or writes. LP/MPS files and MathProg models are solved the same way. For LP-structure grading the
// LP file the program wrote is returned instead of a solution.
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
  SandboxLimits limits;              // wall_seconds is the per-item timeout (program and verdict solve each)
  bool keep_workdirs = false;        // for debugging
  Isolation isolation = Isolation::Jail;  // None only with --unsafe-no-sandbox
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
  std::string solver;   // the solver `trex solve` reports for the verdict
  std::string message;  // error text / traceback tail / sandbox description
  double seconds = 0.0;
};

const char* exec_status_name(ExecStatus s);
std::filesystem::path default_python_pkg();
std::string find_python(const std::string& configured);

// `slot` is the worker's index (a distinct jail identity per worker).
ExecOutcome execute_answer(const BenchItem& item, const ExtractedCode& code, GradeKind grade,
                           const ExecConfig& config, int slot);

// Runs a Python program with extra files in its work directory (plain names -> contents) and solves the
// model it leaves (GradeKind::Objective) or returns its LP file (GradeKind::LpStructure).
ExecOutcome execute_python(const std::string& code, const std::map<std::string, std::string>& files,
                           GradeKind grade, const ExecConfig& config, int slot);

// Throws when `config` asks for a jail that cannot be built here (the message says how to fix it).
void check_isolation(const ExecConfig& config);

}  // namespace trex::orkit::eval
