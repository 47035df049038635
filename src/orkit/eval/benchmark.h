// OR benchmarks in the shared JSONL format (../shared/benchmarks/README.md): one problem per line with
// id, benchmark, question, answer (number or null), answer_type (objective | infeasible | unbounded),
// problem_class and extra (instance data for Bench4Opt, the reference LP for ORGEval, ...).
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trex::orkit::eval {

enum class AnswerType { Objective, Infeasible, Unbounded };
// How an item is graded: by the objective of the model the program builds, or (Bench4Opt-ORGEval) by
// structural equivalence of the LP file it writes with a reference LP.
enum class GradeKind { Objective, LpStructure };

struct BenchItem {
  std::string id;
  std::string benchmark;  // display name from the file ("NL4OPT-289", "B4O-ORGEval", ...)
  std::string question;
  std::optional<double> answer;
  AnswerType answer_type = AnswerType::Objective;
  std::string problem_class;
  GradeKind grade = GradeKind::Objective;
  nlohmann::json data;             // given to the program as data.json (null: no data file)
  std::string reference_lp;        // ORGEval
  std::string data_path;           // Bench4Opt: the dataset path named in the prompt
  nlohmann::json expected_values;  // OptiBench: ReSocratic's per-variable labels (object), else null
  int line = 0;

  // True when the item has something to grade against (objective / infeasible label or a reference LP).
  bool has_ground_truth() const;
};

struct Benchmark {
  std::string name;  // file stem, e.g. "optibench"
  std::filesystem::path path;
  std::vector<BenchItem> items;  // every line, including those without ground truth
  int skipped_no_ground_truth() const;
};

inline constexpr size_t kMaxBenchmarkBytes = size_t(1) << 30;

// Reads a benchmark JSONL file; bad lines (binary bytes, invalid JSON, fields of the wrong type) throw
// trex::Error naming file and line.
Benchmark load_benchmark(const std::filesystem::path& path);
// The same from text already in memory; `source` names it in errors, `name` is the benchmark's stem.
Benchmark parse_benchmark(std::string_view text, const std::string& source, const std::string& name);

const char* answer_type_name(AnswerType t);

}  // namespace trex::orkit::eval
