#include "orkit/eval/benchmark.h"

#include <fstream>

#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/text_input.h"

namespace trex::orkit::eval {

using nlohmann::json;

bool BenchItem::has_ground_truth() const {
  if (grade == GradeKind::LpStructure) return !reference_lp.empty();
  return answer_type != AnswerType::Objective || answer.has_value();
}

int Benchmark::skipped_no_ground_truth() const {
  int n = 0;
  for (const auto& it : items) n += !it.has_ground_truth();
  return n;
}

const char* answer_type_name(AnswerType t) {
  switch (t) {
    case AnswerType::Objective:
      return "objective";
    case AnswerType::Infeasible:
      return "infeasible";
    case AnswerType::Unbounded:
      return "unbounded";
  }
  return "?";
}

static double number_of(const json& v, const std::string& where) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    try {
      size_t pos = 0;
      double d = std::stod(v.get<std::string>(), &pos);
      return d;
    } catch (const std::exception&) {
    }
  }
  fail("{}: expected a number, found {}", where, v.dump());
}

namespace {

BenchItem parse_item(const json& j, const std::string& where, const std::string& default_benchmark) {
  TREX_CHECK(j.is_object() && j.contains("id") && j.contains("question"),
             "{}: expected an object with \"id\" and \"question\"", where);
  auto text = [&](const json& v, const char* field) {
    TREX_CHECK(v.is_string(), "{}: \"{}\" must be a string, found {}", where, field, v.type_name());
    return v.get<std::string>();
  };
  auto text_or = [&](const json& obj, const char* field, const std::string& fallback) {
    return obj.contains(field) ? text(obj[field], field) : fallback;
  };
  BenchItem it;
  it.id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
  it.benchmark = text_or(j, "benchmark", default_benchmark);
  it.question = text(j["question"], "question");
  it.problem_class = text_or(j, "problem_class", "unknown");
  const std::string at = text_or(j, "answer_type", "objective");
  if (at == "objective")
    it.answer_type = AnswerType::Objective;
  else if (at == "infeasible")
    it.answer_type = AnswerType::Infeasible;
  else if (at == "unbounded")
    it.answer_type = AnswerType::Unbounded;
  else
    fail("{}: answer_type must be objective, infeasible or unbounded, found \"{}\"", where, at);
  if (j.contains("answer") && !j["answer"].is_null()) it.answer = number_of(j["answer"], where + ": answer");
  if (j.contains("extra") && !j["extra"].is_null()) {
    const json& extra = j["extra"];
    TREX_CHECK(extra.is_object(), "{}: \"extra\" must be an object, found {}", where, extra.type_name());
    if (extra.contains("data") && !extra["data"].is_null()) it.data = extra["data"];
    it.data_path = text_or(extra, "data_path", "");
    if (extra.contains("reference_lp") && extra["reference_lp"].is_string()) {
      it.reference_lp = extra["reference_lp"].get<std::string>();
      it.grade = GradeKind::LpStructure;
    }
    if (extra.contains("resocratic_results") && extra["resocratic_results"].is_object())
      it.expected_values = extra["resocratic_results"];
  }
  return it;
}

}  // namespace

Benchmark parse_benchmark(std::string_view text, const std::string& source, const std::string& name) {
  require_text(text, source, "benchmark JSONL file");
  Benchmark b;
  b.name = name;
  int lineno = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", source, lineno);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e999
      fail("{}: not valid JSON: {}", where, e.what());
    }
    BenchItem it = parse_item(j, where, name);
    it.line = lineno;
    b.items.push_back(std::move(it));
  }
  TREX_CHECK(!b.items.empty(), "benchmark file {} has no items", source);
  return b;
}

Benchmark load_benchmark(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  TREX_CHECK(!ec, "cannot open benchmark file {}: {}", path.string(), ec.message());
  TREX_CHECK(size <= kMaxBenchmarkBytes, "benchmark file {} has {} bytes; at most {} are read", path.string(), size,
             kMaxBenchmarkBytes);
  Benchmark b = parse_benchmark(read_text_file(path), path.string(), path.stem().string());
  b.path = path;
  return b;
}

}  // namespace trex::orkit::eval
