// Route 2 of the verification: the data section of a family's MathProg model, derived mechanically from
// the instance's data file (never from the route-1 model), so that GLPK computes every coefficient from
// the symbolic formulation on its own.
#pragma once
#include <string>

#include "orkit/gen/instance.h"

namespace trex::orkit::gen {

// JSON -> MathProg "data;" section. Mapping (keys become MathProg names):
//   number                          -> param k := v;
//   [ "a", "b" ]                    -> set k := 'a' 'b';
//   [ ["a","b"], ... ]              -> set k := ('a','b') ...;           (tuples, e.g. arcs)
//   { "a": 3, ... }                 -> param k := 'a' 3 ...;
//   { "a": { "b": 3 } } (any depth) -> param k := 'a' 'b' 3 ...;         (sparse: absent = default)
//   { "a": [ "x", "y" ] }           -> set k['a'] := 'x' 'y';             (indexed sets)
// Keys listed in `skip` are left out (data the MathProg model does not read).
std::string write_mathprog_data(const json& data, const std::vector<std::string>& skip = {});

// The full text GLPK reads: model section, data section, "end;".
std::string mathprog_program(const Instance& inst);

}  // namespace trex::orkit::gen
