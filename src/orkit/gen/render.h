// Turns a verified instance into chat messages: one of three data representations (inline prose,
// Markdown tables, attached data.json) times one of four task categories (formulation, solver code,
// external-data code, LP file). Answers use <think>...</think><model>...</model><python>...</python>,
// or <think>...</think> plus the LP file for the LP-structure category.
#pragma once
#include <string>

#include "orkit/gen/instance.h"
#include "orkit/gen/rng.h"

namespace trex::orkit::gen {

enum class Category { Formulation, SolverCode, ExternalData, LpStructure };
enum class Representation { Inline, Table, Attached };

const char* category_name(Category c);
const char* representation_name(Representation r);
Category parse_category(const std::string& s);
Representation parse_representation(const std::string& s);

// The file form of the attached representation: data.json, or one CSV file per data key (attach_csv.h).
enum class AttachFormat { Json, Csv };
const char* attach_format_name(AttachFormat f);

struct Rendered {
  json messages;  // [{"role","content"}...]
  json files;     // {"data.json": "<text>"} or {"params.csv": ..., "cost.csv": ...} when the program must
                  // read files, else an empty object
};

// The user-visible problem statement (story + data in the chosen representation + question).
std::string problem_statement(const Instance& inst, Representation rep, bool hide_numbers = false,
                              AttachFormat attach = AttachFormat::Json);
// The complete gurobipy program for the representation (data literal, data.json or the CSV files) with
// status printing.
std::string python_program(const Instance& inst, Representation rep, AttachFormat attach = AttachFormat::Json);
// The LP-structure answer: the same program, but it ends with model.write(lp_file_name(inst)) instead of solving.
std::string lp_writer_program(const Instance& inst, Representation rep, AttachFormat attach = AttachFormat::Json);
// The LP file an LP-structure answer writes: "<family>.lp".
std::string lp_file_name(const Instance& inst);
// The model written out with its numbers (only sensible for small instances).
std::string explicit_algebra(const Model& model, size_t max_terms = 400);

Rendered render(const Instance& inst, Category cat, Representation rep, Rng& rng,
                AttachFormat attach = AttachFormat::Json);

}  // namespace trex::orkit::gen
