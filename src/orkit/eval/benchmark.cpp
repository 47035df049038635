#include "orkit/eval/benchmark.h"

#include <fstream>

#include "core/error.h"

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

Benchmark load_benchmark(const std::filesystem::path& path) {
  std::ifstream in(path);
  TREX_CHECK(in.good(), "cannot open benchmark file {}", path.string());
  Benchmark b;
  b.path = path;
  b.name = path.stem().string();
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path.string(), lineno);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      fail("{}: not valid JSON: {}", where, e.what());
    }
    TREX_CHECK(j.is_object() && j.contains("id") && j.contains("question"),
               "{}: expected an object with \"id\" and \"question\"", where);
    BenchItem it;
    it.line = lineno;
    it.id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
    it.benchmark = j.value("benchmark", b.name);
    it.question = j["question"].get<std::string>();
    it.problem_class = j.value("problem_class", "unknown");
    const std::string at = j.value("answer_type", "objective");
    if (at == "objective")
      it.answer_type = AnswerType::Objective;
    else if (at == "infeasible")
      it.answer_type = AnswerType::Infeasible;
    else if (at == "unbounded")
      it.answer_type = AnswerType::Unbounded;
    else
      fail("{}: answer_type must be objective, infeasible or unbounded, found \"{}\"", where, at);
    if (j.contains("answer") && !j["answer"].is_null())
      it.answer = number_of(j["answer"], where + ": answer");
    const json extra = j.value("extra", json::object());
    if (extra.contains("data") && !extra["data"].is_null()) it.data = extra["data"];
    it.data_path = extra.value("data_path", "");
    if (extra.contains("reference_lp") && extra["reference_lp"].is_string()) {
      it.reference_lp = extra["reference_lp"].get<std::string>();
      it.grade = GradeKind::LpStructure;
    }
    if (extra.contains("resocratic_results") && extra["resocratic_results"].is_object())
      it.expected_values = extra["resocratic_results"];
    b.items.push_back(std::move(it));
  }
  TREX_CHECK(!b.items.empty(), "benchmark file {} has no items", path.string());
  return b;
}

}  // namespace trex::orkit::eval
