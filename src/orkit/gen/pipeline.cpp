#include "orkit/gen/pipeline.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "core/progress.h"
#include "orkit/gen/corpus.h"
#include "orkit/gen/cpt.h"
#include "orkit/gen/decontam.h"
#include "orkit/gen/lp_answer.h"
#include "orkit/gen/registry.h"
#include "orkit/gen/render.h"
#include "orkit/gen/report.h"
#include "orkit/gen/verify.h"
#include "orkit/lp/model_util.h"

namespace trex::orkit::gen {
namespace {

std::vector<const Family*> selected_families(const GenerateOptions& o) {
  std::vector<const Family*> out;
  if (o.families.empty()) {
    for (const auto& f : families()) out.push_back(&f);
  } else {
    for (const auto& name : o.families) out.push_back(&find_family(name));
  }
  return out;
}

}  // namespace

json run_attempt(const GenerateOptions& opts, int64_t gi, const void* decontam_index, int slot) {
  const auto* index = static_cast<const BenchmarkIndex*>(decontam_index);
  const uint64_t seed = sample_seed(opts.seed, static_cast<uint64_t>(gi));
  Rng rng(seed);
  const auto fams = selected_families(opts);
  const Family& fam = *fams[static_cast<size_t>(gi) % fams.size()];
  const bool demo = opts.profile == "demo";
  GenRequest req;
  req.short_text = demo;
  req.difficulty = demo ? Difficulty::Small : static_cast<Difficulty>(rng.weighted({0.3, 0.4, 0.2, 0.1}));
  const double r = rng.uniform();
  if (fam.can_infeasible && r < opts.infeasible_share)
    req.target = Expected::Infeasible;
  else if (fam.can_unbounded && r >= opts.infeasible_share && r < opts.infeasible_share + opts.unbounded_share)
    req.target = Expected::Unbounded;
  Category cat = static_cast<Category>(rng.weighted({0.25, 0.30, 0.20, 0.25}));
  Representation rep = cat == Category::ExternalData ? Representation::Attached
                                                      : static_cast<Representation>(rng.weighted({0.45, 0.30, 0.25}));
  const AttachFormat attach =
      rep == Representation::Attached && rng.chance(opts.csv_share) ? AttachFormat::Csv : AttachFormat::Json;
  json res;
  res["index"] = gi;
  res["family"] = fam.name;
  res["ok"] = false;
  Instance inst;
  try {
    inst = fam.generate(rng, req);
  } catch (const std::exception& e) {
    res["reason"] = "generator_error";
    res["detail"] = e.what();
    return res;
  }
  // Long data reads badly as prose: such instances use a table instead.
  if (rep == Representation::Inline && inst.inline_data.size() > 5000) rep = Representation::Table;
  VerifyOptions vo;
  vo.time_limit_s = opts.solve_time_limit_s;
  Verdict v;
  try {
    v = verify_instance(inst, vo);
  } catch (const std::exception& e) {
    v.ok = false;
    v.reason = "verify_error";
    v.detail = e.what();
  }
  res["problem_class"] = inst.problem_class;
  res["difficulty"] = difficulty_name(inst.difficulty);
  res["status"] = expected_name(inst.expected);
  res["category"] = category_name(cat);
  res["representation"] = representation_name(rep);
  res["seconds"] = v.seconds;
  if (!v.ok) {
    res["reason"] = v.reason;
    res["detail"] = v.detail;
    return res;
  }
  const std::string statement = problem_statement(inst, rep, false, attach);
  Overlap ov;
  if (index) ov = index->score(statement);
  res["overlap"] = ov.containment;
  res["overlap_benchmark"] = ov.benchmark;
  if (index && ov.containment >= opts.decontam_threshold) {
    res["reason"] = "decontaminated";
    res["detail"] = fmt::format("{:.3f} of {}-grams found in {} item {}", ov.containment, index->n(), ov.benchmark,
                                ov.item_id);
    return res;
  }
  Rendered rd = render(inst, cat, rep, rng, attach);
  if (cat == Category::LpStructure) {
    // The answer as rendered runs where `trex eval` would run it; the LP file it writes must be
    // ORGEval-equivalent to the verified reference LP, else the sample is dropped.
    const std::string answer = rd.messages.back()["content"].get<std::string>();
    const size_t open = answer.find("<python>\n"), close = answer.rfind("</python>");
    TREX_CHECK(open != std::string::npos && close != std::string::npos && close > open,
               "LP-structure answer of attempt {} has no <python> block", gi);
    std::map<std::string, std::string> files;
    for (auto it = rd.files.begin(); it != rd.files.end(); ++it) files[it.key()] = it->get<std::string>();
    eval::ExecConfig exec = opts.exec;
    if (exec.trex_bin.empty()) exec.trex_bin = std::filesystem::read_symlink("/proc/self/exe");
    LpAnswerCheck c;
    try {
      c = check_lp_answer(answer.substr(open + 9, close - open - 9), files, v.lp, exec, slot);
    } catch (const std::exception& e) {
      c.reason = "lp_answer_program";
      c.detail = e.what();
    }
    if (!c.ok) {
      res["reason"] = c.reason;
      res["detail"] = c.detail;
      return res;
    }
  }
  json s;
  s["id"] = fmt::format("ordata-{}-{}", opts.seed, gi);
  s["messages"] = rd.messages;
  if (!rd.files.empty()) s["files"] = rd.files;
  s["lp"] = v.lp;
  s["objective"] = inst.expected == Expected::Optimal ? json(v.objective) : json(nullptr);
  s["status"] = expected_name(inst.expected);
  s["family"] = inst.family;
  s["category"] = category_name(cat);
  s["representation"] = representation_name(rep);
  if (rep == Representation::Attached) s["attachment"] = attach_format_name(attach);
  s["difficulty"] = difficulty_name(inst.difficulty);
  s["problem_class"] = inst.problem_class;
  s["seed"] = seed;
  s["structure"] = fam.structure;
  s["verification"] = {{"route1", v.solver1}, {"route2", v.solver2},
                       {"objective_route2", inst.expected == Expected::Optimal ? json(v.objective_route2) : json(nullptr)}};
  if (cat == Category::LpStructure) s["verification"]["lp_answer"] = "orgeval_equivalent";
  res["sample"] = std::move(s);
  std::optional<Sensitivity> sens;
  try {
    sens = measure_sensitivity(v, rng);
  } catch (const std::exception&) {
    sens.reset();
  }
  res["cpt"] = worked_example(inst, v, rep == Representation::Attached ? Representation::Table : rep, sens, rng);
  res["ok"] = true;
  return res;
}

namespace {

// Runs the attempts in `gis` in `workers` forked processes; results in the order of `gis`.
std::vector<json> run_batch(const GenerateOptions& opts, const std::vector<int64_t>& gis, const BenchmarkIndex* index,
                            int workers, const std::filesystem::path& work_dir, ProgressBar* bar) {
  std::vector<json> out(gis.size());
  if (workers <= 1 || gis.size() < 4) {
    for (size_t k = 0; k < gis.size(); ++k) {
      out[k] = run_attempt(opts, gis[k], index, 0);
      if (bar) bar->advance();
    }
    return out;
  }
  std::filesystem::create_directories(work_dir);
  int fds[2];
  TREX_CHECK(pipe(fds) == 0, "pipe() failed");
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int w = 0; w < workers; ++w) {
    pid_t pid = fork();
    TREX_CHECK(pid >= 0, "fork() failed");
    if (pid == 0) {
      close(fds[0]);
      int rc = 0;
      try {
        const auto path = work_dir / fmt::format("worker-{}.jsonl", w);
        std::ofstream f(path, std::ios::trunc);
        for (size_t k = w; k < gis.size(); k += workers) {
          json r;
          try {
            r = run_attempt(opts, gis[k], index, w);
          } catch (const std::exception& e) {
            r = {{"index", gis[k]}, {"ok", false}, {"reason", "exception"}, {"detail", e.what()}};
          }
          f << r.dump() << '\n';
          f.flush();
          const char byte = 1;
          (void)!write(fds[1], &byte, 1);
        }
        if (!f) rc = 2;
      } catch (...) {
        rc = 3;
      }
      _exit(rc);
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  char buf[256];
  for (;;) {
    const ssize_t got = read(fds[0], buf, sizeof buf);
    if (got <= 0) break;
    if (bar) bar->advance(got);
  }
  close(fds[0]);
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    TREX_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "generation worker {} failed (status {})", p, st);
  }
  std::map<int64_t, size_t> pos;
  for (size_t k = 0; k < gis.size(); ++k) pos[gis[k]] = k;
  for (int w = 0; w < workers; ++w) {
    const auto path = work_dir / fmt::format("worker-{}.jsonl", w);
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
      json r = json::parse(line);
      TREX_CHECK(r.contains("index") && r["index"].is_number_integer(), "worker {} wrote a result without an index: {}",
                 w, line.substr(0, 300));
      const int64_t gi = r["index"].get<int64_t>();
      auto it = pos.find(gi);
      TREX_CHECK(it != pos.end(), "worker {} returned attempt {} that was not asked for", w, gi);
      out[it->second] = std::move(r);
    }
    std::filesystem::remove(path);
  }
  for (size_t k = 0; k < gis.size(); ++k) TREX_CHECK(!out[k].is_null(), "worker lost attempt {}", gis[k]);
  return out;
}

std::string length_bin(size_t n) {
  static const size_t edges[] = {250, 500, 1000, 2000, 4000, 8000, 16000, 32000};
  size_t lo = 0;
  for (size_t e : edges) {
    if (n < e) return fmt::format("{:>6}-{}", lo, e);
    lo = e;
  }
  return fmt::format("{:>6}+", lo);
}

std::string overlap_bin(double x) {
  const int b = std::min(19, static_cast<int>(x * 20));
  return fmt::format("{:.2f}-{:.2f}", b / 20.0, (b + 1) / 20.0);
}

json sorted_counts(const std::map<std::string, int64_t>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = v;
  return j;
}

}  // namespace

GenerateSummary generate(const GenerateOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  TREX_CHECK(opts.n > 0, "--n must be positive (got {})", opts.n);
  TREX_CHECK(opts.shard_count >= 1 && opts.shard_index >= 0 && opts.shard_index < opts.shard_count,
             "--shard {}/{} is not a valid shard (expected i/n with 0 <= i < n)", opts.shard_index, opts.shard_count);
  TREX_CHECK(opts.profile == "default" || opts.profile == "demo", "unknown --profile '{}' (default or demo)",
             opts.profile);
  TREX_CHECK(!opts.out.empty(), "--out is required");
  (void)selected_families(opts);  // validates names
  eval::check_isolation(opts.exec);  // LP-structure answers need the jail (or --unsafe-no-sandbox)
  std::filesystem::create_directories(opts.out);

  std::unique_ptr<BenchmarkIndex> index;
  json decon = json::object();
  if (opts.benchmarks != "none") {
    index = std::make_unique<BenchmarkIndex>(opts.decontam_n);
    const auto dir = opts.benchmarks.empty() ? shared_dir() / "benchmarks" : opts.benchmarks;
    const size_t q = index->add_dir(dir);
    decon["benchmark_questions"] = q;
    decon["benchmarks"] = index->benchmarks().size();
    decon["ngram"] = opts.decontam_n;
    decon["threshold"] = opts.decontam_threshold;
  }
  const int64_t quota = opts.n / opts.shard_count + (opts.shard_index < opts.n % opts.shard_count ? 1 : 0);
  const int workers = opts.workers > 0 ? opts.workers : std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<ProgressBar> bar;
  if (opts.progress) bar = std::make_unique<ProgressBar>("ordata", quota + quota / 8 + 4, "attempts");

  std::vector<json> kept;
  std::vector<json> attempts_log;  // every attempt up to the last kept one
  int64_t next = 0;
  const int64_t max_attempts = quota * 5 + 200;
  while (static_cast<int64_t>(kept.size()) < quota) {
    const int64_t need = quota - static_cast<int64_t>(kept.size());
    const int64_t batch = need + need / 8 + 4;
    TREX_CHECK(next + batch <= max_attempts, "too many rejected attempts ({} attempts for {} kept); see the "
               "rejection reasons with a smaller --n", next, kept.size());
    std::vector<int64_t> gis;
    for (int64_t k = 0; k < batch; ++k) gis.push_back((next + k) * opts.shard_count + opts.shard_index);
    next += batch;
    auto results = run_batch(opts, gis, index.get(), workers, opts.out / ".work", bar.get());
    for (auto& r : results) {
      if (static_cast<int64_t>(kept.size()) >= quota) break;
      if (r["ok"].get<bool>()) kept.push_back(r);
      attempts_log.push_back(std::move(r));
    }
  }
  std::filesystem::remove_all(opts.out / ".work");
  if (bar) bar->finish();

  // ---- SFT file and statistics.
  json stats;
  stats["profile"] = opts.profile;
  stats["seed"] = opts.seed;
  stats["shard"] = fmt::format("{}/{}", opts.shard_index, opts.shard_count);
  stats["requested"] = quota;
  stats["kept"] = kept.size();
  stats["attempts"] = attempts_log.size();
  stats["rejected"] = attempts_log.size() - kept.size();
  std::map<std::string, std::map<std::string, int64_t>> by;
  std::map<std::string, int64_t> user_len, asst_len, cpt_len, reasons, rej_family, overlap_hist;
  std::map<std::string, double> overlap_max;
  json examples = json::array();
  double max_overlap = 0;
  int64_t decontaminated = 0;
  std::map<std::string, std::pair<double, double>> solve_seconds;  // family -> (sum, max) of verification time
  for (const auto& r : attempts_log) {
    if (r.contains("seconds") && r["seconds"].is_number()) {
      auto& [sum, mx] = solve_seconds[r.value("family", "?")];
      sum += r["seconds"].get<double>();
      mx = std::max(mx, r["seconds"].get<double>());
    }
    if (r.contains("overlap")) {
      const double o = r["overlap"].get<double>();
      overlap_hist[overlap_bin(o)]++;
      max_overlap = std::max(max_overlap, o);
      const std::string b = r.value("overlap_benchmark", "");
      if (!b.empty()) overlap_max[b] = std::max(overlap_max[b], o);
    }
    if (r["ok"].get<bool>()) continue;
    const std::string reason = r.value("reason", "unknown");
    reasons[reason]++;
    rej_family[r.value("family", "?")]++;
    if (reason == "decontaminated") ++decontaminated;
    if (examples.size() < 30)
      examples.push_back({{"index", r["index"]}, {"family", r.value("family", "?")}, {"reason", reason},
                          {"detail", r.value("detail", "").substr(0, 300)}});
  }
  std::string sft;
  std::vector<std::string> gen_docs;
  for (const auto& r : kept) {
    const json& s = r["sample"];
    sft += s.dump() + "\n";
    for (const char* k : {"family", "category", "representation", "difficulty", "problem_class", "status"})
      by[k][s[k].get<std::string>()]++;
    if (s.contains("attachment")) by["attachment"][s["attachment"].get<std::string>()]++;
    by["family_x_category"][s["family"].get<std::string>() + "/" + s["category"].get<std::string>()]++;
    size_t u = 0, a = 0;
    for (const auto& m : s["messages"]) {
      const size_t len = m["content"].get<std::string>().size();
      if (m["role"] == "assistant") a += len;
      else if (m["role"] == "user") u += len;
    }
    user_len[length_bin(u)]++;
    asst_len[length_bin(a)]++;
    gen_docs.push_back(r["cpt"].get<std::string>());
  }
  write_text_atomic(opts.out / "sft.jsonl", sft);

  // ---- CPT corpus: generated worked examples + ingested user text.
  CorpusStats cs;
  std::vector<std::pair<std::string, std::string>> docs;  // (text, source)
  for (auto& d : gen_docs) docs.push_back({normalize_text(d), "generated"});
  size_t ingested_in = 0;
  std::map<std::string, int64_t> quality;
  for (const auto& p : opts.ingest) {
    for (auto& d : read_documents(p)) {
      ++ingested_in;
      std::string t = normalize_text(d);
      const std::string why = quality_reject_reason(t);
      if (!why.empty()) {
        quality[why]++;
        continue;
      }
      docs.push_back({std::move(t), "ingested:" + p.filename().string()});
    }
  }
  std::unordered_set<uint64_t> seen;
  std::vector<std::pair<std::string, std::string>> unique;
  int64_t exact = 0;
  for (auto& d : docs) {
    if (!seen.insert(hash_bytes(d.first.data(), d.first.size())).second) {
      ++exact;
      continue;
    }
    unique.push_back(std::move(d));
  }
  std::vector<std::string> texts;
  for (const auto& d : unique) texts.push_back(d.first);
  size_t near = 0;
  const auto keep = near_duplicate_filter(texts, 0.8, 32, &near);
  std::string cpt;
  int64_t cpt_kept = 0, cpt_generated = 0;
  for (size_t i = 0; i < unique.size(); ++i) {
    if (!keep[i]) continue;
    json line = {{"text", unique[i].first}, {"source", unique[i].second}};
    cpt += line.dump() + "\n";
    ++cpt_kept;
    cpt_generated += unique[i].second == "generated";
    cpt_len[length_bin(unique[i].first.size())]++;
  }
  write_text_atomic(opts.out / "cpt.jsonl", cpt);

  for (auto& [k, m] : by) stats["kept_by"][k] = sorted_counts(m);
  stats["lengths"]["user_chars"] = sorted_counts(user_len);
  stats["lengths"]["assistant_chars"] = sorted_counts(asst_len);
  stats["lengths"]["cpt_chars"] = sorted_counts(cpt_len);
  // Timings vary from run to run, so they go to their own file: stats.json stays byte-identical for a seed.
  json timing = json::object();
  for (const auto& [fam, sm] : solve_seconds) {
    int64_t n = 0;
    for (const auto& r : attempts_log) n += r.value("family", "?") == fam;
    timing["verify_seconds"][fam] = {{"mean", std::round(sm.first / std::max<int64_t>(1, n) * 1e4) / 1e4},
                                     {"max", std::round(sm.second * 1e4) / 1e4}};
  }
  write_text_atomic(opts.out / "timing.json", timing.dump(1) + "\n");
  stats["rejections"]["by_reason"] = sorted_counts(reasons);
  stats["rejections"]["by_family"] = sorted_counts(rej_family);
  stats["rejections"]["examples"] = examples;
  if (index) {
    decon["scored"] = 0;
    int64_t scored = 0;
    for (auto& [k, v] : overlap_hist) scored += v;
    decon["scored"] = scored;
    decon["dropped"] = decontaminated;
    decon["max_containment"] = max_overlap;
    decon["histogram"] = sorted_counts(overlap_hist);
    json mb = json::object();
    for (auto& [k, v] : overlap_max) mb[k] = std::round(v * 1000) / 1000;
    decon["max_by_benchmark"] = mb;
  } else {
    decon["disabled"] = true;
  }
  stats["decontamination"] = decon;
  stats["cpt"] = {{"generated_documents", gen_docs.size()},
                  {"ingested_documents", ingested_in},
                  {"quality_rejected", [&] { int64_t t = 0; for (auto& [k, v] : quality) t += v; return t; }()},
                  {"exact_duplicates", exact},
                  {"near_duplicates", near},
                  {"kept", cpt_kept},
                  {"kept_generated", cpt_generated}};
  for (auto& [k, v] : quality) stats["cpt"]["quality_" + k] = v;
  write_text_atomic(opts.out / "stats.json", stats.dump(1) + "\n");
  write_text_atomic(opts.out / "report.html", html_report(stats));

  GenerateSummary sum;
  sum.kept = kept.size();
  sum.attempts = attempts_log.size();
  sum.rejected = sum.attempts - sum.kept;
  sum.cpt_docs = cpt_kept;
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace trex::orkit::gen
