#include "orkit/eval/suite.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/files.h"
#include "orkit/eval/protocol.h"

namespace trex::orkit::eval {

using nlohmann::json;
namespace fs = std::filesystem;

double pass_at_k(int n, int c, int k) {
  TREX_CHECK(n >= 1 && c >= 0 && c <= n && k >= 1 && k <= n, "pass@k needs 0 <= c <= n and 1 <= k <= n (n {}, c {}, k {})",
             n, c, k);
  if (n - c < k) return 1.0;
  // C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)
  double miss = 1.0;
  for (int i = n - c + 1; i <= n; ++i) miss *= 1.0 - double(k) / double(i);
  return 1.0 - miss;
}

const std::vector<SuiteSet>& report_sets() {
  static const std::vector<SuiteSet> sets{{"NL4OPT-289", "nl4opt_289"},
                                          {"OptiBench-600", "optibench"},
                                          {"B4O-Feasible", "bench4opt_feasible"},
                                          {"B4O-ORGEval", "bench4opt_orgeval"}};
  return sets;
}

namespace {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

}  // namespace

json run_suite(const OpenAIClient& client, ResponseCache& cache, const SuiteOptions& opts, const json& meta) {
  const int n = opts.generate.samples;
  for (int k : opts.ks) TREX_CHECK(k >= 1 && k <= n, "Pass@{} needs at least {} samples per item (--samples {})", k, k, n);
  std::vector<Benchmark> benches;
  for (const SuiteSet& set : report_sets()) {  // every file read before any request is sent
    const fs::path p = opts.benchmarks_dir / (set.stem + ".jsonl");
    TREX_CHECK(fs::exists(p), "benchmark {} ({}) not found in {}", set.label, p.filename().string(),
               opts.benchmarks_dir.string());
    Benchmark b = load_benchmark(p);
    if (opts.generate.limit > 0 && int(b.items.size()) > opts.generate.limit) b.items.resize(size_t(opts.generate.limit));
    benches.push_back(std::move(b));
  }
  json sets = json::array();
  std::string sample_lines;
  std::map<int, double> mean;
  for (size_t si = 0; si < benches.size(); ++si) {
    const SuiteSet& set = report_sets()[si];
    const Benchmark& b = benches[si];
    SuiteSetResult res;
    res.set = set;
    res.samples = n;
    const auto answers = generate_samples(b, client, cache, opts.generate, opts.progress, res.generation);
    std::vector<std::string> ids;
    for (const auto& it : b.items)
      if (it.has_ground_truth()) ids.push_back(it.id), res.correct_of[it.id] = 0;
    res.items = int(ids.size());
    for (int s = 0; s < n; ++s) {
      std::map<std::string, std::string> one;
      for (const auto& [id, v] : answers)
        if (int(v.size()) > s) one[id] = v[size_t(s)];
      const BenchmarkScore score = score_benchmark(b, apply_protocol(opts.generate.protocol, b, one), opts.score);
      res.rule = rule_name(score.rule);
      for (const ItemResult& r : score.results) {
        if (r.status == "correct") ++res.correct_of[r.id];
        json line = r.to_json();
        line["sample"] = s;
        line["set"] = set.label;
        sample_lines += line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
      }
    }
    json per_k = json::object();
    for (int k : opts.ks) {
      double sum = 0.0;
      for (const auto& id : ids) sum += pass_at_k(n, res.correct_of[id], k);
      res.pass_at[k] = ids.empty() ? 0.0 : 100.0 * sum / double(ids.size());
      per_k["pass@" + std::to_string(k)] = res.pass_at[k];
      mean[k] += res.pass_at[k] / double(report_sets().size());
    }
    sets.push_back({{"label", set.label},
                    {"benchmark", set.stem},
                    {"items", res.items},
                    {"samples", n},
                    {"rule", res.rule},
                    {"pass_at", per_k},
                    {"correct_of", res.correct_of},
                    {"generation",
                     {{"requests", res.generation.requests},
                      {"cached", res.generation.cached},
                      {"failed", res.generation.failed},
                      {"prompt_tokens", res.generation.prompt_tokens},
                      {"completion_tokens", res.generation.completion_tokens}}}});
  }
  json average = json::object();
  for (int k : opts.ks) average["pass@" + std::to_string(k)] = mean[k];
  json out = meta.is_object() ? meta : json::object();
  out["protocol"] = protocol_name(opts.generate.protocol);
  out["samples"] = n;
  out["ks"] = opts.ks;
  out["sampling"] = opts.generate.sampling.to_json();
  out["sets"] = sets;
  out["average"] = average;  // plain mean of the four percentages, as the report averages
  fs::create_directories(opts.out);
  write_text_atomic(opts.out / "samples.jsonl", sample_lines);
  write_json_atomic(opts.out / "suite.json", out, 1);
  write_text_atomic(opts.out / "suite.html", suite_html(out));
  return out;
}

std::string suite_html(const json& suite) {
  const auto ks = suite.value("ks", std::vector<int>{1});
  std::string h =
      "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>T-Rex OR evaluation: the four sets</title>\n"
      "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
      "td,th{border:1px solid #999;padding:4px 10px;text-align:right}th{background:#eee}"
      "td.l{text-align:left}</style></head><body>\n<h1>OR benchmarks: the founding report's four sets</h1>\n";
  h += "<p>Model <b>" + html_escape(suite.value("model", std::string("?"))) + "</b>, protocol <b>" +
       html_escape(suite.value("protocol", std::string("?"))) + "</b>, " + std::to_string(suite.value("samples", 1)) +
       " sample(s) per item, sampling " + html_escape(suite.value("sampling", json::object()).dump()) +
       ". Pass@k is the unbiased estimator 1 - C(n-c,k)/C(n,k), averaged over items; Average is the plain mean "
       "of the four sets.</p>\n<table>\n<tr><th class=\"l\">set</th><th>items</th><th>rule</th>";
  for (int k : ks) h += "<th>Pass@" + std::to_string(k) + "</th>";
  h += "</tr>\n";
  for (const auto& s : suite.value("sets", json::array())) {
    h += "<tr><td class=\"l\">" + html_escape(s.value("label", std::string())) + "</td><td>" +
         std::to_string(s.value("items", 0)) + "</td><td>" + html_escape(s.value("rule", std::string())) + "</td>";
    for (int k : ks)
      h += fmt::format("<td>{:.2f}</td>", s["pass_at"].value("pass@" + std::to_string(k), 0.0));
    h += "</tr>\n";
  }
  h += "<tr><th class=\"l\">Average</th><th></th><th></th>";
  for (int k : ks) h += fmt::format("<th>{:.2f}</th>", suite["average"].value("pass@" + std::to_string(k), 0.0));
  h += "</tr>\n</table>\n</body></html>\n";
  return h;
}

}  // namespace trex::orkit::eval
