// MPS format (free and fixed) for trex::orkit::Model.
//
// Reader: NAME, OBJSENSE (MIN/MAX, same or next line), OBJSENSE MAXIMIZE, ROWS (N/L/G/E; the first N row
// is the objective, other N rows are dropped), COLUMNS with MARKER INTORG/INTEND, RHS (an entry on the
// objective row gives objective_constant = -value, the CPLEX/GLPK/CBC convention), RANGES (a ranged row
// becomes `name` plus `name_hi`, as in the LP reader), BOUNDS (UP LO FX FR MI PL BV LI UI; a negative UP
// with no LO makes the lower bound -inf, as CPLEX/GLPK do), QUADOBJ / QMATRIX (objective 0.5 x'Qx), ENDATA.
// Fields are separated by whitespace, so fixed-format files read as long as names contain no spaces;
// an omitted RHS/RANGES/BOUNDS set name is recognised by the field count. Integer columns declared
// between INT markers without bounds get [0, +inf) (not the old binary default). A column named exactly
// `Constant`, fixed and in no row (how the writer stores the objective constant), is folded into
// objective_constant.
// Writer: free MPS that glpsol (--freemps) and cbc read; quadratic objectives go to QUADOBJ, quadratic
// rows are rejected with an error. A Maximize objective is written as an OBJSENSE MAX section (CPLEX,
// Gurobi, HiGHS and this reader take it; glpsol rejects the section and cbc ignores it), or, with
// objsense_section = false, as the minimisation of the negated objective (every reader then finds the
// same optimal point; the optimal value is negated).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

#include "orkit/lp/model.h"

namespace trex::orkit {

Model read_mps(std::string_view text, const std::string& source_name = "<mps text>");
Model read_mps_file(const std::filesystem::path& path);

struct MpsWriteOptions {
  bool objsense_section = true;
  // The objective constant as a fixed column `Constant` (objective coefficient c, FX 1), which every
  // reader understands; off: as an RHS entry on the objective row (value -c, the CPLEX/CBC convention;
  // GLPK reads such an entry with the opposite sign).
  bool constant_as_variable = true;
};

std::string write_mps(const Model& model, const MpsWriteOptions& opts = {});
void write_mps_file(const Model& model, const std::filesystem::path& path, const MpsWriteOptions& opts = {});

}  // namespace trex::orkit
