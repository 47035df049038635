// GNU MathProg (GMPL) models through GLPK's glp_mpl_* API: translate the model (and an optional
// separate data file), generate, build the problem, solve, postsolve (so `display`/`printf` statements
// after `solve;` run and their text is returned). Needs TREX_HAVE_GLPK; without it every call throws.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "orkit/lp/model.h"
#include "orkit/solve/solve.h"

namespace trex::orkit {

struct MathProgResult {
  Model model;         // the generated problem (free rows dropped, see model_from_glpk)
  SolveResult result;  // values in model.vars order
  std::string output;  // text the model printed (display/printf) during generation and postsolve
};

// Translate only (model and data read, nothing generated): throws trex::Error on a syntax error or on
// binary input (NUL or other non-text bytes, named with line and byte offset). Cheap and bounded by the
// text, unlike generation, which evaluates the model's sets.
void check_mathprog_syntax(std::string_view model_text, std::string_view data_text = {},
                           const std::string& source = "<mathprog>");

// Translate + generate only: the model as a trex Model (e.g. to write it as LP). Errors throw
// trex::Error with GLPK's message (which names the line) and `source`.
Model mathprog_to_model(std::string_view model_text, std::string_view data_text = {},
                        const std::string& source = "<mathprog>");
Model mathprog_file_to_model(const std::filesystem::path& model_file,
                             const std::optional<std::filesystem::path>& data_file = std::nullopt);

// Translate, generate, solve and postsolve. With solver Auto or Glpk the generated GLPK problem is
// solved directly and postsolved; with another backend the converted Model is solved (no postsolve).
MathProgResult solve_mathprog(std::string_view model_text, std::string_view data_text = {},
                              const SolveOptions& options = {}, const std::string& source = "<mathprog>");
MathProgResult solve_mathprog_file(const std::filesystem::path& model_file,
                                   const std::optional<std::filesystem::path>& data_file = std::nullopt,
                                   const SolveOptions& options = {});

}  // namespace trex::orkit
