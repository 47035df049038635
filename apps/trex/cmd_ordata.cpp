// `trex ordata generate|check`: solver-verified OR data for SFT and CPT (src/orkit/gen).
#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "command.h"
#include "core/error.h"
#include "orkit/gen/distill.h"
#include "orkit/gen/pipeline.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/verify.h"

namespace {

void setup_generate(CLI::App& app) {
  auto opts = std::make_shared<trex::orkit::gen::GenerateOptions>();
  auto shard = std::make_shared<std::string>("0/1");
  auto out = std::make_shared<std::string>();
  auto bench = std::make_shared<std::string>();
  auto ingest = std::make_shared<std::vector<std::string>>();
  app.add_option("--n", opts->n, "number of verified SFT samples to write")->required();
  app.add_option("--seed", opts->seed, "run seed (same seed and options: same bytes)")->capture_default_str();
  app.add_option("--out", *out, "output directory (sft.jsonl, cpt.jsonl, stats.json, report.html, timing.json)")->required();
  app.add_option("--shard", *shard, "i/n: this process makes shard i of n (disjoint sample indices)")
      ->capture_default_str();
  app.add_option("--workers", opts->workers, "worker processes (0: one per hardware thread)")->capture_default_str();
  app.add_option("--profile", opts->profile, "default, or demo (small instances, short texts)")->capture_default_str();
  app.add_option("--families", opts->families, "restrict to these families (default: all)");
  app.add_option("--benchmarks", *bench, "benchmark directory for decontamination (default <shared>/benchmarks; "
                                        "'none' disables it)");
  app.add_option("--decontam-threshold", opts->decontam_threshold,
                 "drop a question when this fraction of its n-grams occurs in a benchmark")->capture_default_str();
  app.add_option("--decontam-n", opts->decontam_n, "word n-gram length for decontamination")->capture_default_str();
  app.add_option("--infeasible-share", opts->infeasible_share, "share of infeasible instances (families that allow it)")
      ->capture_default_str();
  app.add_option("--unbounded-share", opts->unbounded_share, "share of unbounded instances (families that allow it)")
      ->capture_default_str();
  app.add_option("--csv-share", opts->csv_share, "share of attached-file samples given as CSV files instead of data.json")
      ->capture_default_str();
  app.add_option("--ingest", *ingest, "domain text for the CPT corpus (.txt, .md, .jsonl with \"text\")");
  app.add_option("--time-limit", opts->solve_time_limit_s, "seconds per solve")->capture_default_str();
  app.add_flag("!--no-progress", opts->progress, "no progress bar");
  app.add_flag_function(
      "--unsafe-no-sandbox",
      [opts](int64_t) { opts->exec.isolation = trex::orkit::eval::Isolation::None; },
      "run the LP-structure answers for their check without the bubblewrap jail (they are the generator's own "
      "programs; docs/ordata.md)");
  app.callback([=] {
    trex::orkit::gen::GenerateOptions o = *opts;
    o.out = *out;
    if (!bench->empty()) o.benchmarks = *bench;
    for (const auto& p : *ingest) o.ingest.push_back(p);
    int i = 0, n = 0;
    char tail = 0;
    TREX_CHECK(std::sscanf(shard->c_str(), "%d/%d%c", &i, &n, &tail) == 2, "--shard '{}': expected i/n, e.g. 0/4",
               *shard);
    o.shard_index = i;
    o.shard_count = n;
    const auto s = trex::orkit::gen::generate(o);
    std::fprintf(stderr, "ordata: kept %lld of %lld attempts (%lld rejected), %lld CPT documents, %.1f s -> %s\n",
                 static_cast<long long>(s.kept), static_cast<long long>(s.attempts),
                 static_cast<long long>(s.rejected), static_cast<long long>(s.cpt_docs), s.seconds, out->c_str());
  });
}

void setup_check(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  app.add_option("sft", *file, "an sft.jsonl written by `trex ordata generate`")->required();
  app.callback([=] {
    std::ifstream f(*file);
    TREX_CHECK(f, "cannot open {}", *file);
    std::string line;
    size_t lineno = 0, bad = 0;
    while (std::getline(f, line)) {
      ++lineno;
      const auto j = nlohmann::json::parse(line);
      const std::string why = trex::orkit::gen::recheck_lp(
          j.at("lp").get<std::string>(), j.at("status").get<std::string>(),
          j.at("objective").is_null() ? 0.0 : j.at("objective").get<double>());
      if (!why.empty()) {
        ++bad;
        std::fprintf(stderr, "%s:%zu (%s): %s\n", file->c_str(), lineno, j.value("id", "?").c_str(), why.c_str());
      }
    }
    std::fprintf(stderr, "checked %zu samples, %zu disagree\n", lineno, bad);
    if (bad) trex::cli::exit_with(1);
  });
}

void setup_distill(CLI::App& app) {
  auto o = std::make_shared<trex::orkit::gen::DistillOptions>();
  auto in = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto trex_bin = std::make_shared<std::string>(), pkg = std::make_shared<std::string>();
  app.add_option("--in", *in, "sft.jsonl written by `trex ordata generate`")->required();
  app.add_option("--base-url", o->base_url, "OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")->required();
  app.add_option("--model", o->model, "teacher model name")->required();
  app.add_option("--out", *out, "output directory (sft.jsonl, rejections.jsonl, distill_stats.json)")->required();
  app.add_option("--samples", o->samples, "teacher answers per item (rejection sampling; first correct kept)")
      ->capture_default_str();
  app.add_option("--limit", o->limit, "use only the first N items (0: all)")->capture_default_str();
  app.add_option("--workers", o->workers, "items in flight at once")->capture_default_str();
  app.add_option("--temperature", o->temperature, "sampling temperature")->capture_default_str();
  app.add_option("--top-p", o->top_p, "nucleus sampling")->capture_default_str();
  app.add_option("--max-tokens", o->max_tokens, "completion token limit")->capture_default_str();
  app.add_option("--seed", o->seed, "sampling seed of the first answer (answer k uses seed + k)")->capture_default_str();
  app.add_option("--timeout", o->exec_timeout_s, "seconds per executed answer")->capture_default_str();
  app.add_option("--request-timeout", o->request_timeout_s, "seconds per HTTP request")->capture_default_str();
  app.add_option("--max-attempts", o->max_attempts, "HTTP attempts per request")->capture_default_str();
  app.add_option("--rel-tol", o->rel_tol, "relative objective tolerance")->capture_default_str();
  app.add_option("--python", o->python, "Python interpreter (default /usr/bin/python3, else python3 on PATH)");
  app.add_option("--python-pkg", *pkg, "directory of the solver look-alikes (default python/trex_solvers)");
  app.add_option("--trex-bin", *trex_bin, "trex binary the look-alikes call (default: this one)");
  app.add_flag("!--no-progress", o->progress, "no progress bar");
  app.callback([=] {
    trex::orkit::gen::DistillOptions opts = *o;
    opts.in = *in;
    opts.out = *out;
    opts.trex_bin = *trex_bin;
    opts.python_pkg = *pkg;
    const auto s = trex::orkit::gen::distill(opts);
    std::string reasons;
    for (const auto& [k, v] : s.rejected) reasons += fmt::format(" {}={}", k, v);
    std::fprintf(stderr, "distill: kept %lld of %lld items (%lld answers; rejected:%s), %.1f s -> %s\n",
                 static_cast<long long>(s.kept), static_cast<long long>(s.items), static_cast<long long>(s.answers),
                 reasons.empty() ? " none" : reasons.c_str(), s.seconds, out->c_str());
  });
}

void setup_families(CLI::App& app) {
  app.callback([] {
    for (const auto& f : trex::orkit::gen::families())
      std::printf("%-24s %-22s infeasible:%s unbounded:%s\n", f.name.c_str(), f.structure.c_str(),
                  f.can_infeasible ? "yes" : "no", f.can_unbounded ? "yes" : "no");
  });
}

const bool registered = trex::cli::register_command(
    {"ordata", "solver-verified OR data for SFT and CPT (generate, check, distill, families)", [](CLI::App& app) {
       app.require_subcommand(1);
       setup_generate(*app.add_subcommand("generate", "generate verified SFT samples and a CPT corpus"));
       setup_check(*app.add_subcommand("check", "re-solve the lp field of every sample and compare"));
       setup_distill(*app.add_subcommand("distill", "rejection-sample teacher answers that reproduce the verified result"));
       setup_families(*app.add_subcommand("families", "list the problem families"));
     }});

}  // namespace
