// `trex eval`: zero-shot Pass@1 on OR benchmarks, for pre-generated answers (score) or a served model (run);
// `trex eval suite`: the founding report's four-set table with Pass@k from n samples per item.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "orkit/eval/benchmark.h"
#include "orkit/eval/generate.h"
#include "orkit/eval/protocol.h"
#include "orkit/eval/runner.h"
#include "orkit/eval/suite.h"

namespace {

using namespace trex::orkit::eval;
namespace fs = std::filesystem;

struct CommonOpts {
  std::vector<std::string> benchmarks;
  std::string out, rule, python, trex_bin, python_pkg;
  std::string protocol = "trex";
  double timeout = 60.0;
  double memory_gb = 4.0;
  int jobs = 0;
  bool keep = false;
  bool no_progress = false;
  bool unsafe_no_sandbox = false;
};

void add_common(CLI::App& sub, CommonOpts& o) {
  sub.add_option("--out", o.out, "output directory (results.jsonl, summary.json, report.html)")->required();
  sub.add_option("--rule", o.rule,
                 "scoring rule: trex-abs, rel (sirl/optimind), orlm, resocratic, abs-0.1, abs-0.01 "
                 "(default: the benchmark's own; ORGEval always uses orgeval)");
  sub.add_option("--timeout", o.timeout, "wall-clock seconds per program")->capture_default_str();
  sub.add_option("--memory-gb", o.memory_gb, "address-space limit per program (GiB)")->capture_default_str();
  sub.add_option("--jobs", o.jobs, "programs run in parallel (default: number of cores)");
  sub.add_option("--python", o.python, "Python interpreter (default /usr/bin/python3, else python3 on PATH)");
  sub.add_option("--trex-bin", o.trex_bin, "trex binary used for `trex solve` (default: this binary)");
  sub.add_option("--python-pkg", o.python_pkg, "directory with the solver look-alikes (python/trex_solvers)");
  sub.add_flag("--keep-workdirs", o.keep, "keep each program's temporary directory");
  sub.add_flag("--no-progress", o.no_progress, "no progress bar");
  sub.add_option("--protocol", o.protocol,
                 "trex (T-Rex's corrected protocol) or report (the founding report's prompts, extraction and "
                 "ORGEval rewrites, quirks included; docs/eval.md)")
      ->capture_default_str();
  sub.add_flag("--unsafe-no-sandbox", o.unsafe_no_sandbox,
               "run the programs without the bubblewrap jail: they can read and write what this user can, reach "
               "the network and read the answer key (only for trusted answers; docs/eval.md, Isolation)");
}

ScoreOptions score_options(const CommonOpts& o) {
  ScoreOptions so;
  if (!o.rule.empty()) so.rule = parse_rule(o.rule);
  so.exec.python = o.python;
  so.exec.trex_bin = o.trex_bin.empty() ? fs::read_symlink("/proc/self/exe") : fs::path(o.trex_bin);
  so.exec.python_pkg = o.python_pkg;
  so.exec.keep_workdirs = o.keep;
  so.exec.limits.wall_seconds = o.timeout;
  so.exec.limits.memory_bytes = size_t(o.memory_gb * double(size_t(1) << 30));
  so.jobs = o.jobs;
  so.progress = !o.no_progress;
  if (o.unsafe_no_sandbox) {
    so.exec.isolation = Isolation::None;
    std::fputs("warning: --unsafe-no-sandbox: the programs run unisolated, with this user's access to files, "
               "the network and the answer key; their scores are not trustworthy\n",
               stderr);
  }
  TREX_CHECK(o.timeout > 0, "--timeout must be positive");
  TREX_CHECK(fs::exists(so.exec.python_pkg.empty() ? default_python_pkg() : so.exec.python_pkg),
             "solver look-alikes not found at {} (set --python-pkg or TREX_PYTHON_PKG)",
             (so.exec.python_pkg.empty() ? default_python_pkg() : so.exec.python_pkg).string());
  return so;
}

void finish(const fs::path& out, const std::vector<BenchmarkScore>& scores, nlohmann::json meta,
            double seconds) {
  meta["elapsed_seconds"] = seconds;
  write_results(out, scores, meta);
  std::fputs(summary_table(scores).c_str(), stdout);
  std::printf("wrote %s/results.jsonl, summary.json, report.html (%.1f s)\n", out.c_str(), seconds);
}

void setup_score(CLI::App& sub) {
  auto o = std::make_shared<CommonOpts>();
  auto responses = std::make_shared<std::string>();
  sub.add_option("--benchmark", o->benchmarks, "benchmark JSONL file(s)")
      ->required()
      ->check(CLI::ExistingFile);
  sub.add_option("--responses", *responses, "JSONL of {\"id\": ..., \"response\": \"<whole answer>\"}")
      ->required()
      ->check(CLI::ExistingFile);
  add_common(sub, *o);
  sub.callback([o, responses] {
    auto t0 = std::chrono::steady_clock::now();
    const ScoreOptions so = score_options(*o);
    check_isolation(so.exec);  // before any work: no jail and no --unsafe-no-sandbox is an error
    const auto answers = load_responses(*responses);
    std::vector<BenchmarkScore> scores;
    const Protocol protocol = parse_protocol(o->protocol);
    for (const auto& path : o->benchmarks) {
      const Benchmark b = load_benchmark(path);
      scores.push_back(score_benchmark(b, apply_protocol(protocol, b, answers), so));
    }
    nlohmann::json meta{
        {"mode", "score"}, {"responses", *responses}, {"jobs", so.jobs}, {"timeout_seconds", o->timeout},
        {"protocol", o->protocol},
        {"isolation", o->unsafe_no_sandbox ? "none (--unsafe-no-sandbox)" : "bubblewrap jail"}};
    finish(o->out, scores, meta,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

void setup_run(CLI::App& sub) {
  auto o = std::make_shared<CommonOpts>();
  auto g = std::make_shared<GenerateOptions>();
  sub.add_option("--benchmark", o->benchmarks, "benchmark JSONL file(s)")
      ->required()
      ->check(CLI::ExistingFile);
  sub.add_option("--base-url", g->client.base_url,
                 "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
      ->required();
  sub.add_option("--model", g->client.model, "model name sent to the server")->required();
  sub.add_option("--api-key-env", g->client.api_key_env, "environment variable holding the API key")
      ->capture_default_str();
  sub.add_option("--prompt", g->prompt_format,
                 "prompt format: auto (per benchmark), trex, python, lp, mathprog, b4o-feasible, orgeval")
      ->capture_default_str();
  sub.add_option("--temperature", g->sampling.temperature)->capture_default_str();
  sub.add_option("--top-p", g->sampling.top_p)->capture_default_str();
  sub.add_option("--max-tokens", g->sampling.max_tokens)->capture_default_str();
  sub.add_option("--seed", g->sampling.seed)->capture_default_str();
  sub.add_option("--concurrency", g->concurrency, "requests in flight")->capture_default_str();
  sub.add_option("--retries", g->client.max_attempts, "attempts per request")->capture_default_str();
  sub.add_option("--request-timeout", g->client.timeout_seconds, "seconds per request")
      ->capture_default_str();
  sub.add_option("--limit", g->limit, "only the first N items of each benchmark (0: all)");
  sub.add_option("--data-base-dir", g->data_base_dir,
                 "the Bench4Opt prompt's \"File Path Base Directory\" (default: the benchmark file's directory)");
  auto generate_only = std::make_shared<bool>(false);
  sub.add_flag("--generate-only", *generate_only,
               "only generate: write OUT/responses.jsonl (score it with `trex eval score --responses` where the "
               "solvers are, e.g. after answering on a GPU machine without them)");
  add_common(sub, *o);
  sub.callback([o, g, generate_only] {
    auto t0 = std::chrono::steady_clock::now();
    const ScoreOptions so = score_options(*o);
    g->protocol = parse_protocol(o->protocol);
    if (!*generate_only) check_isolation(so.exec);  // before generating: a run that cannot be scored stops here
    fs::create_directories(o->out);
    ResponseCache cache(fs::path(o->out) / "cache.jsonl");
    OpenAIClient client(g->client);
    std::vector<BenchmarkScore> scores;
    nlohmann::json usage{
        {"prompt_tokens", 0}, {"completion_tokens", 0}, {"requests", 0}, {"cached", 0}, {"failed", 0}};
    std::vector<ResponseLine> lines;
    for (const auto& path : o->benchmarks) {
      Benchmark b = load_benchmark(path);
      if (g->limit > 0 && int(b.items.size()) > g->limit) b.items.resize(g->limit);
      GenerationStats st;
      const auto answers = generate_responses(b, client, cache, *g, !o->no_progress, st);
      usage["prompt_tokens"] = usage["prompt_tokens"].get<long>() + st.prompt_tokens;
      usage["completion_tokens"] = usage["completion_tokens"].get<long>() + st.completion_tokens;
      usage["requests"] = usage["requests"].get<long>() + st.requests;
      usage["cached"] = usage["cached"].get<long>() + st.cached;
      usage["failed"] = usage["failed"].get<long>() + st.failed;
      if (*generate_only) {
        for (const auto& [id, text] : answers) lines.push_back({id, b.name, text});
        continue;
      }
      scores.push_back(score_benchmark(b, apply_protocol(g->protocol, b, answers), so));
    }
    if (*generate_only) {
      const fs::path file = fs::path(o->out) / "responses.jsonl";
      write_responses(file, lines);
      const nlohmann::json gen{{"mode", "generate-only"},  {"model", g->client.model},
                               {"base_url", g->client.base_url}, {"prompt", g->prompt_format},
                               {"sampling", g->sampling.to_json()}, {"usage", usage},
                               {"responses", file.string()},     {"answers", lines.size()}};
      trex::write_json_atomic(fs::path(o->out) / "generation.json", gen);
      std::printf("%s\n", gen.dump().c_str());
      return;
    }
    nlohmann::json meta{{"mode", "run"},
                        {"model", g->client.model},
                        {"base_url", g->client.base_url},
                        {"prompt", g->prompt_format},
                        {"protocol", o->protocol},
                        {"sampling", g->sampling.to_json()},
                        {"usage", usage},
                        {"isolation", o->unsafe_no_sandbox ? "none (--unsafe-no-sandbox)" : "bubblewrap jail"}};
    finish(o->out, scores, meta,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

void setup_suite(CLI::App& sub) {
  auto o = std::make_shared<CommonOpts>();
  auto so = std::make_shared<SuiteOptions>();
  auto dir = std::make_shared<std::string>((trex::shared_dir() / "benchmarks").string());
  GenerateOptions& g = so->generate;
  sub.add_option("--benchmarks-dir", *dir,
                 "directory with nl4opt_289.jsonl, optibench.jsonl, bench4opt_feasible.jsonl, bench4opt_orgeval.jsonl")
      ->capture_default_str();
  sub.add_option("--base-url", g.client.base_url, "OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
      ->required();
  sub.add_option("--model", g.client.model, "model name sent to the server")->required();
  sub.add_option("--api-key-env", g.client.api_key_env, "environment variable holding the API key")
      ->capture_default_str();
  sub.add_option("--samples", g.samples, "answers per item, n (asked for with the API's n, else one by one)")
      ->capture_default_str();
  sub.add_option("--k", so->ks, "Pass@k to report, each k <= n (e.g. --k 1 --k 4)")->capture_default_str();
  sub.add_option("--prompt", g.prompt_format, "prompt format (auto: per benchmark)")->capture_default_str();
  sub.add_option("--temperature", g.sampling.temperature)->capture_default_str();
  sub.add_option("--top-p", g.sampling.top_p)->capture_default_str();
  sub.add_option("--max-tokens", g.sampling.max_tokens)->capture_default_str();
  sub.add_option("--seed", g.sampling.seed)->capture_default_str();
  sub.add_option("--concurrency", g.concurrency, "requests in flight")->capture_default_str();
  sub.add_option("--retries", g.client.max_attempts, "attempts per request")->capture_default_str();
  sub.add_option("--request-timeout", g.client.timeout_seconds, "seconds per request")->capture_default_str();
  sub.add_option("--limit", g.limit, "only the first N items of each set (0: all)");
  sub.add_option("--data-base-dir", g.data_base_dir,
                 "the Bench4Opt prompt's \"File Path Base Directory\" (default: the benchmarks directory)");
  add_common(sub, *o);
  sub.callback([o, so, dir] {
    auto t0 = std::chrono::steady_clock::now();
    TREX_CHECK(o->rule.empty(), "--rule does not apply to the suite: each set is scored under the report's rule");
    so->score = score_options(*o);
    so->score.progress = !o->no_progress;
    check_isolation(so->score.exec);
    so->generate.protocol = parse_protocol(o->protocol);
    so->benchmarks_dir = *dir;
    so->out = o->out;
    so->progress = !o->no_progress;
    fs::create_directories(so->out);
    ResponseCache cache(so->out / "cache.jsonl");
    OpenAIClient client(so->generate.client);
    const nlohmann::json meta{
        {"mode", "suite"}, {"model", so->generate.client.model}, {"base_url", so->generate.client.base_url},
        {"isolation", o->unsafe_no_sandbox ? "none (--unsafe-no-sandbox)" : "bubblewrap jail"}};
    const nlohmann::json suite = run_suite(client, cache, *so, meta);
    std::printf("%-16s %6s", "set", "items");
    for (int k : so->ks) std::printf("  Pass@%-3d", k);
    std::printf("\n");
    for (const auto& s : suite["sets"]) {
      std::printf("%-16s %6d", s["label"].get<std::string>().c_str(), s["items"].get<int>());
      for (int k : so->ks) std::printf("  %7.2f ", s["pass_at"]["pass@" + std::to_string(k)].get<double>());
      std::printf("\n");
    }
    std::printf("%-16s %6s", "Average", "");
    for (int k : so->ks) std::printf("  %7.2f ", suite["average"]["pass@" + std::to_string(k)].get<double>());
    std::printf("\nwrote %s/suite.json, suite.html, samples.jsonl (%.1f s)\n", so->out.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

const bool registered = trex::cli::register_command(
    {"eval", "zero-shot Pass@1 on OR benchmarks (score pre-generated answers or run a served model)",
     [](CLI::App& app) {
       app.require_subcommand(1);
       setup_score(*app.add_subcommand("score", "score pre-generated answers (a responses JSONL file)"));
       setup_run(*app.add_subcommand("run", "generate answers with an OpenAI-compatible server, then score"));
       setup_suite(*app.add_subcommand(
           "suite", "the report's four-set table (NL4OPT-289, OptiBench-600, B4O-Feasible, B4O-ORGEval): n samples "
                    "per item, Pass@k, one HTML page + JSON"));
     }});

}  // namespace
