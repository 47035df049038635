#include "orkit/gen/distill.h"

#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/files.h"
#include "core/progress.h"
#include "orkit/eval/execute.h"
#include "orkit/eval/extract.h"
#include "orkit/eval/openai_client.h"
#include "orkit/eval/sandbox.h"
#include "orkit/gen/lp_answer.h"
#include "orkit/gen/verify.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/solve/solve.h"

namespace trex::orkit::gen {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// Content of <tag>...</tag> (case-insensitive, last complete pair wins so that a model quoting the format
// first and answering afterwards is read correctly); nullopt when absent.
std::optional<std::string> tag_content(const std::string& text, const std::string& tag) {
  const std::string lo = lower(text), open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t c = lo.rfind(close);
  if (c == std::string::npos) return std::nullopt;
  const size_t o = lo.rfind(open, c);
  if (o == std::string::npos) {
    if (tag == "think") return text.substr(0, c);  // reasoning models often omit the opening tag
    return std::nullopt;
  }
  return text.substr(o + open.size(), c - o - open.size());
}

// Drops a ``` fence around code (the canonical layout has raw code inside <python>).
std::string unfence(const std::string& code) {
  std::string s = trim(code);
  if (s.rfind("```", 0) != 0) return s;
  const size_t nl = s.find('\n');
  if (nl == std::string::npos) return s;
  s = s.substr(nl + 1);
  const size_t end = s.rfind("```");
  if (end != std::string::npos) s = s.substr(0, end);
  return trim(s);
}

bool status_agrees(const std::string& got, const std::string& want) {
  return got == want || (got == "infeasible_or_unbounded" && (want == "infeasible" || want == "unbounded"));
}

struct ItemResult {
  json kept;  // null when nothing passed
  std::vector<json> rejections;
};

}  // namespace

std::string CleanAnswer::text() const {
  std::string out = "<think>\n" + trim(think) + "\n</think>\n";
  if (!trim(model).empty()) out += "<model>\n" + trim(model) + "\n</model>\n";
  if (lp) return out + "```lp\n" + trim(code) + "\n```";
  return out + "<python>\n" + trim(code) + "\n</python>";
}

std::optional<CleanAnswer> clean_answer(const std::string& response) {
  CleanAnswer a;
  a.think = trim(tag_content(response, "think").value_or(""));
  a.model = trim(tag_content(response, "model").value_or(""));
  if (auto py = tag_content(response, "python"); py && !trim(*py).empty()) {
    a.code = unfence(*py);
  } else {
    const eval::ExtractedCode ex = eval::extract_code(response);
    if (ex.format == eval::CodeFormat::Python) {
      a.code = trim(ex.code);
    } else if (ex.format == eval::CodeFormat::Lp) {
      a.code = trim(ex.code);
      a.lp = true;
    } else {
      return std::nullopt;
    }
  }
  if (a.code.empty()) return std::nullopt;
  return a;
}

json run_python_answer(const std::string& code, const json& files, const DistillOptions& opts, int slot) {
  // The evaluator's path: the program runs in the jail, the harness solves the model it leaves.
  json out = {{"status", "error"}, {"objective", nullptr}, {"message", ""}};
  try {
    std::map<std::string, std::string> attached;
    if (files.is_object())
      for (auto it = files.begin(); it != files.end(); ++it) attached[it.key()] = it->get<std::string>();
    eval::ExecConfig cfg;
    cfg.python = opts.python;
    cfg.python_pkg = opts.python_pkg;
    cfg.trex_bin = opts.trex_bin;
    cfg.limits.wall_seconds = opts.exec_timeout_s;
    const eval::ExecOutcome r = eval::execute_python(code, attached, eval::GradeKind::Objective, cfg, slot);
    out["message"] = r.message;
    switch (r.status) {
      case eval::ExecStatus::Optimal:
        out["status"] = "optimal";
        out["objective"] = *r.objective;
        break;
      case eval::ExecStatus::Infeasible:
      case eval::ExecStatus::Unbounded:
      case eval::ExecStatus::InfeasibleOrUnbounded:
      case eval::ExecStatus::Timeout:
        out["status"] = eval::exec_status_name(r.status);
        break;
      case eval::ExecStatus::NoModel:
        out["message"] = "no model: " + r.message;
        break;
      default:
        break;
    }
  } catch (const std::exception& e) {
    out["message"] = e.what();
  }
  return out;
}

namespace {

ItemResult distill_item(const json& sample, const DistillOptions& o, const eval::OpenAIClient& client,
                        int slot) {
  ItemResult res;
  std::vector<eval::ChatMessage> prompt;
  for (const auto& m : sample.at("messages"))
    if (m.at("role") != "assistant")
      prompt.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  const std::string want = sample.at("status").get<std::string>();
  const bool lp_task = sample.value("category", "") == "lp_structure";
  for (int k = 0; k < o.samples; ++k) {
    auto reject = [&](const std::string& reason, const std::string& detail) {
      res.rejections.push_back({{"id", sample.value("id", "?")},
                                {"answer", k},
                                {"reason", reason},
                                {"detail", detail.substr(0, 500)}});
    };
    eval::SamplingParams sp;
    sp.temperature = o.temperature;
    sp.top_p = o.top_p;
    sp.max_tokens = o.max_tokens;
    sp.seed = o.seed + k;
    const eval::ChatResult cr = client.chat(prompt, sp);
    if (!cr.ok) {
      reject("http_error", cr.error);
      continue;
    }
    const auto clean = clean_answer(cr.content);
    if (!clean) {
      reject("no_code", "the answer has no <python> block, fenced program or LP file");
      continue;
    }
    if (clean->think.empty()) {
      reject("no_reasoning", "the answer has no <think> section");
      continue;
    }
    if (clean->lp) {
      reject("wrong_format", lp_task ? "a Python program that writes the LP file was asked for"
                                     : "a Python program was asked for");
      continue;
    }
    if (lp_task) {
      // The LP-structure contract: the program writes the model as an LP file, graded by ORGEval against
      // the sample's verified LP (lp_answer.h), as `trex ordata generate` checks its own answers.
      std::map<std::string, std::string> files;
      const json jf = sample.value("files", json::object());
      for (auto it = jf.begin(); it != jf.end(); ++it) files[it.key()] = it->get<std::string>();
      eval::ExecConfig cfg;
      cfg.python = o.python;
      cfg.python_pkg = o.python_pkg;
      cfg.trex_bin = o.trex_bin;
      cfg.limits.wall_seconds = o.exec_timeout_s;
      LpAnswerCheck c;
      try {
        c = check_lp_answer(clean->code, files, sample.at("lp").get<std::string>(), cfg, slot);
      } catch (const std::exception& e) {
        c.reason = "lp_answer_program";
        c.detail = e.what();
      }
      if (!c.ok) {
        reject(c.reason, c.detail);
        continue;
      }
      json kept = sample;
      json msgs = json::array();
      for (const auto& m : sample.at("messages"))
        if (m.at("role") != "assistant") msgs.push_back(m);
      msgs.push_back({{"role", "assistant"}, {"content", clean->text()}});
      kept["messages"] = msgs;
      kept["id"] = sample.value("id", "?") + "-distill";
      kept["distill"] = {{"teacher", o.model}, {"answer", k}, {"finish_reason", cr.finish_reason},
                         {"lp_answer", "orgeval_equivalent"}};
      res.kept = std::move(kept);
      break;
    }
    const json run = run_python_answer(clean->code, sample.value("files", json::object()), o, slot);
    const std::string got = run["status"];
    if (got == "error" || got == "timeout") {
      reject(got == "timeout" ? "timeout" : "program_error", run.value("message", ""));
      continue;
    }
    if (!status_agrees(got, want)) {
      reject("status_mismatch", fmt::format("status {} but the verified status is {}", got, want));
      continue;
    }
    if (want == "optimal") {
      const double ref = sample.at("objective").get<double>();
      if (!run["objective"].is_number() ||
          !objectives_agree(run["objective"].get<double>(), ref, o.rel_tol)) {
        reject("objective_mismatch", fmt::format("objective {} but the verified objective is {:.12g}",
                                                 run["objective"].dump(), ref));
        continue;
      }
    }
    json kept = sample;
    json msgs = json::array();
    for (const auto& m : sample.at("messages"))
      if (m.at("role") != "assistant") msgs.push_back(m);
    msgs.push_back({{"role", "assistant"}, {"content", clean->text()}});
    kept["messages"] = msgs;
    kept["id"] = sample.value("id", "?") + "-distill";
    kept["distill"] = {{"teacher", o.model},
                       {"answer", k},
                       {"finish_reason", cr.finish_reason},
                       {"objective", run["objective"]},
                       {"status", got}};
    res.kept = std::move(kept);
    break;
  }
  return res;
}

}  // namespace

DistillSummary distill(const DistillOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  TREX_CHECK(!opts.base_url.empty(), "--base-url is required");
  TREX_CHECK(!opts.model.empty(), "--model is required");
  TREX_CHECK(opts.samples >= 1, "--samples must be at least 1 (got {})", opts.samples);
  TREX_CHECK(!opts.out.empty(), "--out is required");
  DistillOptions o = opts;
  if (o.trex_bin.empty()) o.trex_bin = fs::read_symlink("/proc/self/exe");
  std::vector<json> items;
  {
    std::ifstream f(o.in);
    TREX_CHECK(f, "cannot open {}", o.in.string());
    std::string line;
    int lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (line.empty()) continue;
      json j;
      try {
        j = json::parse(line);
      } catch (const std::exception& e) {
        trex::fail("{}:{}: not JSON: {}", o.in.string(), lineno, e.what());
      }
      TREX_CHECK(j.contains("messages") && j.contains("status") && j.contains("objective"),
                 "{}:{}: not an ordata SFT sample (needs messages, status, objective)", o.in.string(),
                 lineno);
      items.push_back(std::move(j));
      if (o.limit > 0 && static_cast<int64_t>(items.size()) >= o.limit) break;
    }
  }
  fs::create_directories(o.out);
  eval::ClientOptions co;
  co.base_url = o.base_url;
  co.model = o.model;
  co.timeout_seconds = o.request_timeout_s;
  co.max_attempts = o.max_attempts;
  co.backoff_seconds = o.backoff_s;
  const eval::OpenAIClient client(co);
  std::vector<ItemResult> results(items.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::unique_ptr<ProgressBar> bar;
  if (o.progress) bar = std::make_unique<ProgressBar>("distill", static_cast<int64_t>(items.size()), "items");
  std::atomic<int64_t> kept_so_far{0};
  auto work = [&](int slot) {
    for (size_t i = next++; i < items.size(); i = next++) {
      try {
        results[i] = distill_item(items[i], o, client, slot);
      } catch (const std::exception& e) {
        results[i].rejections.push_back({{"id", items[i].value("id", "?")},
                                         {"answer", -1},
                                         {"reason", "exception"},
                                         {"detail", std::string(e.what()).substr(0, 500)}});
      }
      if (!results[i].kept.is_null()) ++kept_so_far;
      if (bar) {
        std::lock_guard<std::mutex> lock(mu);
        bar->advance(1, fmt::format("kept {}", kept_so_far.load()));
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < std::max(1, o.workers); ++w) pool.emplace_back(work, w);
  for (auto& t : pool) t.join();
  if (bar) bar->finish();

  DistillSummary s;
  s.items = static_cast<int64_t>(items.size());
  std::string kept_text, rej_text;
  std::map<std::string, std::map<std::string, int64_t>> kept_by;
  for (size_t i = 0; i < results.size(); ++i) {
    s.answers += static_cast<int64_t>(results[i].rejections.size()) + (results[i].kept.is_null() ? 0 : 1);
    for (const auto& r : results[i].rejections) {
      s.rejected[r["reason"].get<std::string>()]++;
      rej_text += r.dump() + "\n";
    }
    if (!results[i].kept.is_null()) {
      ++s.kept;
      kept_text += results[i].kept.dump() + "\n";
      for (const char* k : {"family", "category", "representation"})
        if (results[i].kept.contains(k)) kept_by[k][results[i].kept[k].get<std::string>()]++;
    }
  }
  write_text_atomic(o.out / "sft.jsonl", kept_text);
  write_text_atomic(o.out / "rejections.jsonl", rej_text);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json stats = {{"input", o.in.string()}, {"teacher", o.model},
                {"base_url", o.base_url}, {"samples_per_item", o.samples},
                {"items", s.items},       {"answers", s.answers},
                {"kept", s.kept},         {"rel_tol", o.rel_tol},
                {"seconds", s.seconds}};
  stats["rejected_by_reason"] = json::object();
  for (const auto& [k, v] : s.rejected) stats["rejected_by_reason"][k] = v;
  stats["kept_by"] = json::object();
  for (const auto& [k, m] : kept_by)
    for (const auto& [v, c] : m) stats["kept_by"][k][v] = c;
  write_json_atomic(o.out / "distill_stats.json", stats);
  return s;
}

}  // namespace trex::orkit::gen
