// The CSV form of an instance's data (the attached-file representation offers data.json or CSV files).
// One file per data key, in long format so that any nesting fits a flat table:
//   scalars (all of them)        -> params.csv     columns name,value
//   list of names                -> <key>.csv      column  name
//   list of tuples (arcs, pairs) -> <key>.csv      columns c1,c2,...
//   {a: v} / {a: {b: v}} / ...   -> <key>.csv      columns key1[,key2...],value
//   {a: [names]} (indexed sets)  -> <key>.csv      columns key1,name
// csv_loader_python() writes the Python that reads those files back into the same `data` dict the
// family's code uses, so a program for the CSV form differs from the JSON form only in its loader.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "orkit/gen/instance.h"

namespace trex::orkit::gen {

struct CsvFile {
  std::string name;         // "cost.csv"
  std::string text;         // header + rows
  std::string description;  // "key1 = food, value = cost per serving" style note for prompts
};

std::vector<CsvFile> csv_files(const Instance& inst);
// Python statements that build `data` from the CSV files in the working directory.
std::string csv_loader_python(const json& data);

}  // namespace trex::orkit::gen
