// `trex solve FILE`: read an LP / MPS / MathProg model, solve it with an open solver, print the status,
// objective and variable values (text, or one JSON object with --json; schema in
// src/orkit/solve/result_json.h). FILE "-" reads an LP (or --format mps) from stdin.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/lp/mps_format.h"
#include "orkit/solve/mathprog.h"
#include "orkit/solve/result_json.h"
#include "orkit/solve/solve.h"

namespace {

using namespace trex::orkit;

struct SolveArgs {
  std::string file;
  std::string solver = "auto";
  std::string format = "auto";
  std::string data;
  double time_limit = 0.0;
  double mip_gap = 0.0;
  bool json = false;
  bool verbose = false;
  bool all_values = false;
  std::string write_lp_path, write_mps_path;
};

std::string detect_format(const SolveArgs& a) {
  if (a.format != "auto") return a.format;
  auto ends = [&](const char* ext) {
    const std::string e = ext;
    return a.file.size() >= e.size() && a.file.compare(a.file.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".mps") || ends(".MPS") || ends(".qps") || ends(".mps.txt")) return "mps";
  if (ends(".mod") || ends(".gmpl") || ends(".mpl")) return "mathprog";
  return "lp";
}

void print_text(const Model& m, const SolveResult& r, bool all_values, const std::string& extra_output) {
  if (!extra_output.empty()) std::fputs(extra_output.c_str(), stdout);
  std::printf("status: %s\n", status_name(r.status));
  if (!r.values.empty()) std::printf("objective: %s\n", format_number(r.objective).c_str());
  std::printf("solver: %s\nseconds: %.6f\n", r.solver.c_str(), r.seconds);
  if (!r.message.empty()) std::printf("message: %s\n", r.message.c_str());
  if (r.values.size() == m.vars.size()) {
    size_t hidden = 0;
    for (size_t j = 0; j < m.vars.size(); ++j) {
      if (!all_values && r.values[j] == 0.0) {
        ++hidden;
        continue;
      }
      std::printf("  %s = %s\n", m.vars[j].name.c_str(), format_number(r.values[j]).c_str());
    }
    if (hidden) std::printf("  (%zu variables at 0 not shown; --all prints them)\n", hidden);
  }
}

void run_solve(const SolveArgs& a) {
  SolveOptions opts;
  Model model;
  const std::string format = detect_format(a);
  try {
    opts.solver = parse_solver(a.solver);
    opts.time_limit_s = a.time_limit;
    opts.mip_gap = a.mip_gap;
    opts.verbose = a.verbose;
    if (format == "mathprog") {
      std::optional<std::filesystem::path> data;
      if (!a.data.empty()) data = a.data;
      MathProgResult mp = solve_mathprog_file(a.file, data, opts);
      if (!a.write_lp_path.empty()) write_lp_file(mp.model, a.write_lp_path);
      if (!a.write_mps_path.empty()) write_mps_file(mp.model, a.write_mps_path);
      if (a.json) {
        auto j = result_to_json(mp.model, mp.result);
        j["output"] = mp.output;
        std::printf("%s\n", j.dump().c_str());
      } else {
        print_text(mp.model, mp.result, a.all_values, a.verbose ? mp.output : "");
      }
      return;
    }
    std::string text;
    std::string source = a.file;
    if (a.file == "-") {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      source = "<stdin>";
    } else {
      text = trex::read_text_file(a.file);
    }
    if (format == "lp") {
      model = read_lp(text, source);
    } else if (format == "mps") {
      model = read_mps(text, source);
    } else {
      trex::fail("unknown --format '{}' (expected lp, mps or mathprog)", format);
    }
  } catch (const trex::Error& e) {
    if (!a.json) throw;
    std::printf("%s\n", error_json(e.what()).dump().c_str());
    trex::cli::exit_with(1);
  }
  if (!a.write_lp_path.empty()) write_lp_file(model, a.write_lp_path);
  if (!a.write_mps_path.empty()) write_mps_file(model, a.write_mps_path);
  SolveResult r;
  try {
    r = solve(model, opts);
  } catch (const trex::Error& e) {
    if (!a.json) throw;
    std::printf("%s\n", error_json(e.what()).dump().c_str());
    trex::cli::exit_with(1);
  }
  if (a.json) {
    std::printf("%s\n", result_to_json(model, r).dump().c_str());
  } else {
    print_text(model, r, a.all_values, "");
  }
}

const bool registered = trex::cli::register_command({
    "solve",
    "Solve an LP/MPS/MathProg model with CBC, CLP, GLPK or Ipopt",
    [](CLI::App& sub) {
      auto a = std::make_shared<SolveArgs>();
      sub.add_option("file", a->file, "model file (.lp, .mps, .mod); '-' reads stdin")->required();
      sub.add_option("--solver", a->solver, "auto (integer programs: cbc and glpk raced, the first proof wins), cbc, clp, glpk, ipopt")->capture_default_str();
      sub.add_option("--format", a->format, "auto (by extension), lp, mps, mathprog")->capture_default_str();
      sub.add_option("--data", a->data, "MathProg data file");
      sub.add_option("--time-limit", a->time_limit, "seconds (0: none)");
      sub.add_option("--mip-gap", a->mip_gap, "relative MIP gap (0: prove optimality)");
      sub.add_flag("--json", a->json, "print one JSON object (schema: src/orkit/solve/result_json.h)");
      sub.add_flag("--verbose", a->verbose, "show the solver's log");
      sub.add_flag("--all", a->all_values, "also print variables at 0 (text output)");
      sub.add_option("--write-lp", a->write_lp_path, "also write the model as CPLEX LP");
      sub.add_option("--write-mps", a->write_mps_path, "also write the model as free MPS");
      sub.callback([a] { run_solve(*a); });
    },
});

}  // namespace
