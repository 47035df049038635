#include "orkit/eval/runner.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/files.h"
#include "core/progress.h"
#include "orkit/eval/orgeval.h"
#include "orkit/lp/lp_format.h"

namespace trex::orkit::eval {

using nlohmann::json;

namespace {

std::string trim_message(const std::string& s, size_t n = 1500) {
  return s.size() <= n ? s : s.substr(0, n / 3) + "\n...\n" + s.substr(s.size() - 2 * n / 3);
}

json opt(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

// Every worker slot runs its programs under its own jail identity; refuses to start unisolated unless the
// caller chose Isolation::None (--unsafe-no-sandbox).
void require_isolation(const ExecConfig& exec, int jobs) {
  check_isolation(exec);
  TREX_CHECK(jobs <= kJailUidCount, "--jobs {} is more than the {} jail identities", jobs, kJailUidCount);
}

}  // namespace

json ItemResult::to_json() const {
  return json{{"id", id},
              {"benchmark", benchmark},
              {"status", status},
              {"detail", detail},
              {"predicted", opt(predicted)},
              {"expected", opt(expected)},
              {"expected_type", expected_type},
              {"format", format},
              {"solver", solver},
              {"seconds", seconds},
              {"message", message}};
}

ItemResult score_item(const BenchItem& item, const std::string* response, Rule rule, const ExecConfig& exec,
                      int slot) {
  ItemResult r;
  r.id = item.id;
  r.benchmark = item.benchmark;
  r.expected = item.answer;
  r.expected_type =
      item.grade == GradeKind::LpStructure ? "lp_structure" : answer_type_name(item.answer_type);
  if (!response) {
    r.status = "no_code";
    r.detail = "no_response";
    r.format = "none";
    return r;
  }
  const ExtractedCode code = extract_code(*response);
  r.format = format_name(code.format);
  if (code.format == CodeFormat::None) {
    r.status = "no_code";
    r.detail = "no_code";
    return r;
  }
  auto t0 = std::chrono::steady_clock::now();
  ExecOutcome out;
  try {
    out = execute_answer(item, code, item.grade, exec, slot);
  } catch (const std::exception& e) {
    out.status = ExecStatus::ProgramError;
    out.message = std::string("evaluator: ") + e.what();
  }
  r.message = trim_message(out.message);
  r.detail = exec_status_name(out.status);
  r.solver = out.solver;
  switch (out.status) {
    case ExecStatus::Timeout:
      r.status = "timeout";
      break;
    case ExecStatus::ProgramError:
    case ExecStatus::Crashed:
    case ExecStatus::SolverError:
    case ExecStatus::NoModel:
      r.status = "error";
      break;
    case ExecStatus::Optimal: {
      r.predicted = out.objective;
      if (item.answer_type != AnswerType::Objective) {
        r.status = "wrong";
      } else if (rule == Rule::ReSocratic && item.expected_values.is_object() &&
                 !item.expected_values.empty()) {
        r.status = resocratic_matches(item.expected_values, *out.objective, out.values) ? "correct" : "wrong";
      } else if (rule == Rule::LpStructure) {
        r.status = "error";
        r.detail = "lp_structure_needs_lp";
      } else {
        r.status = objective_matches(rule, *out.objective, *item.answer) ? "correct" : "wrong";
      }
      break;
    }
    case ExecStatus::Infeasible:
      r.status = item.answer_type == AnswerType::Infeasible ? "correct" : "infeasible";
      break;
    case ExecStatus::Unbounded:
      r.status = item.answer_type == AnswerType::Unbounded ? "correct" : "unbounded";
      break;
    case ExecStatus::InfeasibleOrUnbounded:
      r.status = item.answer_type != AnswerType::Objective ? "correct" : "infeasible";
      break;
    case ExecStatus::LpWritten: {
      try {
        const Model ref = read_lp(item.reference_lp, item.id + " reference LP");
        Model cand;
        try {
          cand = read_lp(out.lp_text, item.id + " answer LP");
        } catch (const std::exception& e) {
          r.status = "error";
          r.detail = "lp_parse_error";
          r.message = trim_message(e.what());
          break;
        }
        const EquivalenceVerdict v = check_lp_equivalence(ref, cand);
        r.status = v.equivalent ? "correct" : "wrong";
        r.detail = v.reason;
        if (!v.equivalent)
          r.message =
              fmt::format("reference {} vars / {} rows, answer {} vars / {} rows (after normalisation)",
                          v.reference_vars, v.reference_rows, v.candidate_vars, v.candidate_rows);
      } catch (const std::exception& e) {
        r.status = "error";
        r.detail = "reference_lp_error";
        r.message = trim_message(e.what());
      }
      break;
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

BenchmarkScore score_benchmark(const Benchmark& bench, const std::map<std::string, std::string>& responses,
                               const ScoreOptions& opts) {
  BenchmarkScore s;
  s.name = bench.name;
  s.display_name = bench.items.empty() ? bench.name : bench.items.front().benchmark;
  const bool lp_structure = !bench.items.empty() && bench.items.front().grade == GradeKind::LpStructure;
  s.rule = opts.rule ? *opts.rule : default_rule(bench.name, lp_structure, s.display_name);
  TREX_CHECK(lp_structure == (s.rule == Rule::LpStructure),
             "rule {} does not apply to {}: LP-structure benchmarks use orgeval, others an objective rule",
             rule_name(s.rule), bench.path.string());
  s.items = int(bench.items.size());
  std::vector<const BenchItem*> todo;
  for (const auto& it : bench.items) {
    if (it.has_ground_truth())
      todo.push_back(&it);
    else
      ++s.skipped_no_ground_truth;
  }
  s.results.resize(todo.size());
  int jobs = opts.jobs > 0 ? opts.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
  jobs = std::max(1, std::min<int>(jobs, int(todo.size())));
  require_isolation(opts.exec, jobs);
  std::atomic<size_t> next{0};
  std::atomic<int> correct{0};
  std::mutex mu;
  std::optional<ProgressBar> bar;
  if (opts.progress) bar.emplace("score " + bench.name, int64_t(todo.size()), "item");
  auto t0 = std::chrono::steady_clock::now();
  auto worker = [&](int slot) {
    for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
      const BenchItem& item = *todo[i];
      auto r = responses.find(item.id);
      s.results[i] = score_item(item, r == responses.end() ? nullptr : &r->second, s.rule, opts.exec, slot);
      if (s.results[i].status == "correct") ++correct;
      if (bar) {
        std::lock_guard<std::mutex> lock(mu);
        bar->advance(1, fmt::format("correct {}", correct.load()));
      }
    }
  };
  std::vector<std::thread> pool;
  for (int j = 0; j < jobs; ++j) pool.emplace_back(worker, j);
  for (auto& t : pool) t.join();
  if (bar) bar->finish(fmt::format("correct {}/{}", correct.load(), todo.size()));
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& r : s.results) {
    ++s.scored;
    s.correct += r.status == "correct";
    ++s.status_counts[r.status];
    if (r.status != "correct") ++s.detail_counts[r.status + ":" + r.detail];
  }
  return s;
}

std::map<std::string, std::string> load_responses(const std::filesystem::path& path) {
  std::ifstream in(path);
  TREX_CHECK(in.good(), "cannot open responses file {}", path.string());
  std::map<std::string, std::string> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      fail("{}:{}: not valid JSON: {}", path.string(), lineno, e.what());
    }
    TREX_CHECK(j.is_object() && j.contains("id") && j.contains("response"),
               "{}:{}: expected {{\"id\": ..., \"response\": \"...\"}}", path.string(), lineno);
    const std::string id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
    TREX_CHECK(j["response"].is_string() || j["response"].is_null(), "{}:{}: \"response\" must be a string",
               path.string(), lineno);
    if (j["response"].is_string()) out[id] = j["response"].get<std::string>();
  }
  return out;
}

void write_responses(const std::filesystem::path& path, const std::vector<ResponseLine>& lines) {
  std::string text;
  for (const ResponseLine& l : lines)
    text += json{{"id", l.id}, {"benchmark", l.benchmark}, {"response", l.response}}.dump(
                -1, ' ', false, json::error_handler_t::replace) +
            "\n";
  write_text_atomic(path, text);
}

json summary_json(const std::vector<BenchmarkScore>& scores, const json& meta) {
  json out = meta.is_object() ? meta : json::object();
  json list = json::array();
  int scored = 0, correct = 0;
  double macro = 0.0;
  for (const auto& s : scores) {
    list.push_back({{"benchmark", s.name},
                    {"display_name", s.display_name},
                    {"rule", rule_name(s.rule)},
                    {"rule_description", rule_description(s.rule)},
                    {"items", s.items},
                    {"skipped_no_ground_truth", s.skipped_no_ground_truth},
                    {"scored", s.scored},
                    {"correct", s.correct},
                    {"pass_at_1", s.pass_at_1()},
                    {"status_counts", s.status_counts},
                    {"failure_details", s.detail_counts},
                    {"seconds", s.seconds}});
    scored += s.scored;
    correct += s.correct;
    macro += s.pass_at_1();
  }
  out["benchmarks"] = list;
  out["overall"] = {{"scored", scored},
                    {"correct", correct},
                    {"pass_at_1_micro", scored ? 100.0 * correct / scored : 0.0},
                    {"pass_at_1_macro", scores.empty() ? 0.0 : macro / double(scores.size())}};
  return out;
}

std::string summary_table(const std::vector<BenchmarkScore>& scores) {
  std::string t = fmt::format("{:<28} {:>6} {:>6} {:>7} {:>8}  {:<40} {}\n", "benchmark", "scored", "skip",
                              "correct", "pass@1", "rule", "failures");
  int scored = 0, correct = 0;
  double macro = 0.0;
  for (const auto& s : scores) {
    std::string fails;
    for (const auto& [k, n] : s.status_counts)
      if (k != "correct") fails += fmt::format("{}{} {}", fails.empty() ? "" : ", ", k, n);
    t += fmt::format("{:<28} {:>6} {:>6} {:>7} {:>7.2f}%  {:<40} {}\n", s.name, s.scored,
                     s.skipped_no_ground_truth, s.correct, s.pass_at_1(), rule_description(s.rule), fails);
    scored += s.scored, correct += s.correct, macro += s.pass_at_1();
  }
  if (scores.size() > 1)
    t += fmt::format("{:<28} {:>6} {:>6} {:>7} {:>7.2f}%  (micro; macro mean of benchmarks {:.2f}%)\n",
                     "overall", scored, "", correct, scored ? 100.0 * correct / scored : 0.0,
                     macro / double(scores.size()));
  return t;
}

void write_results(const std::filesystem::path& dir, const std::vector<BenchmarkScore>& scores,
                   const json& meta) {
  std::filesystem::create_directories(dir);
  std::string lines;
  for (const auto& s : scores)
    for (const auto& r : s.results)
      lines += r.to_json().dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  write_text_atomic(dir / "results.jsonl", lines);
  write_json_atomic(dir / "summary.json", summary_json(scores, meta), 1);
  write_text_atomic(dir / "report.html", html_report(scores, meta));
}

}  // namespace trex::orkit::eval
