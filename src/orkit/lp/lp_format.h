// CPLEX LP format: reader and writer for trex::orkit::Model.
//
// Reader accepts (keywords case-insensitive, recognised at the start of a line):
//   Minimize|Minimum|Min|Minimise / Maximize|Maximum|Max|Maximise, an optional objective name `obj:`;
//   Subject To|Such That|st|s.t.|st.; named (`c1:`) and unnamed rows (auto-named R<row index>, as Gurobi
//   does); expressions over several lines, implicit coefficients, scientific notation, constants and
//   variables on either side; relations <= =< < >= => > =; ranged rows `lo <= expr <= hi` (stored as two
//   rows `name` (>= lo) and `name_hi` (<= hi), or one `=` row when lo == hi); quadratic terms in brackets
//   `[ x ^ 2 + 2 x * y ] / 2` (objective) and `[ ... ]` (rows); Bounds (`x free`, -inf/+inf/infinity,
//   `x >= 3`, `2 <= x <= 5`, `x = 4`); General/Generals/Gen/Integers; Binary/Binaries/Bin (bounds
//   intersected with [0, 1]); End. Semi-continuous, SOS, indicator and general-constraint sections are
//   rejected with an error naming the line. Comments start with '\'.
//   Gurobi writes an objective constant as `+ c Constant` with `Constant = 1` in Bounds; by default the
//   reader folds such a pseudo-variable (named exactly "Constant", fixed, in no row) into
//   Model::objective_constant.
// Every syntax error throws trex::Error "<source>:<line>: <what was expected, what was found>".
//
// Writer emits a canonical file that this reader, `glpsol --lp` and `cbc` accept (see LpWriteOptions).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

#include "orkit/lp/model.h"

namespace trex::orkit {

struct LpReadOptions {
  bool fold_constant_variable = true;  // Gurobi's `Constant` pseudo-variable -> objective_constant
};

Model read_lp(std::string_view text, const std::string& source_name = "<lp text>", const LpReadOptions& opts = {});
Model read_lp_file(const std::filesystem::path& path, const LpReadOptions& opts = {});

struct LpWriteOptions {
  // Rename variables/rows to the CPLEX name alphabet (GLPK's reader rejects '[' ']', Gurobi's usual
  // `x[0]`): '[' -> '(', ']' -> ')', other foreign characters -> '_', clashes get a numeric suffix.
  // Off: names are kept except characters this reader cannot take (whitespace, + - * ^ < > = :).
  bool portable_names = false;
  // Objective constant as Gurobi writes it (`+ c Constant`, `Constant = 1` in Bounds; every LP reader
  // takes it) or as a bare number (CPLEX/CBC accept it, glpsol does not).
  bool constant_as_variable = true;
};

std::string write_lp(const Model& model, const LpWriteOptions& opts = {});
void write_lp_file(const Model& model, const std::filesystem::path& path, const LpWriteOptions& opts = {});

// Shortest decimal text that reads back to exactly `v` ("inf"/"-inf" for infinities).
std::string format_number(double v);

}  // namespace trex::orkit
