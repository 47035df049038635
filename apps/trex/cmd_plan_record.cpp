// `trex plan-record`: turns the JSON lines printed by `trex bench train` (and by ../shared/bench/hf_baseline.py)
// into planner measurement records and appends them to docs/measurements/measurements.jsonl, where
// `trex plan-calibrate` and tests/plan/test_calibration.cpp pick them up. Recording is a separate step from the
// benchmark because the device machine's files come back read-only; every record names its source.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "plan/calibrate.h"

namespace {

using nlohmann::json;

struct RecordOptions {
  std::string input = "-";
  std::string measurements;
  std::string hardware = "nvidia-h200";
  std::string source;
  std::string mode = "cpt";
  std::string optimizer = "adamw";
  bool replace = false;
  bool dry_run = false;
};

// "single" | "dp=2" | "ep=2" | "pp=2,micro_batches=8" (bench --mesh) -> planner layout text + devices.
// micro_batch: sequences per rank per forward (the bench's --batch) when there is no pipeline.
std::string planner_layout(const std::string& mesh, int64_t gpus, int64_t micro_batches_hint) {
  if (mesh.empty() || mesh == "single") return fmt::format("DP1,MBS{}", micro_batches_hint);
  std::map<std::string, int64_t> kv;
  size_t pos = 0;
  while (pos < mesh.size()) {
    size_t comma = mesh.find(',', pos);
    std::string item = mesh.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    TREX_CHECK(eq != std::string::npos, "plan-record: mesh '{}': item '{}' is not key=value", mesh, item);
    kv[item.substr(0, eq)] = std::stoll(item.substr(eq + 1));
    pos = comma == std::string::npos ? mesh.size() : comma + 1;
  }
  const int64_t pp = kv.count("pp") ? kv["pp"] : 1, ep = kv.count("ep") ? kv["ep"] : 1;
  int64_t dp = kv.count("dp") ? kv["dp"] : gpus / pp;
  if (ep > 1 && dp < ep) dp = ep;  // EP folds into DP (parallel folding)
  std::string out = pp > 1 ? fmt::format("PP{},", pp) : "";
  if (ep > 1) out += fmt::format("EP{},", ep);
  out += fmt::format("DP{},MBS{}", dp, pp > 1 ? 1 : micro_batches_hint);
  return out;
}

json to_record(const json& line, const RecordOptions& o, const std::string& where) {
  auto need = [&](const char* key) -> const json& {
    TREX_CHECK(line.contains(key), "plan-record: {}: the bench line has no '{}'", where, key);
    return line.at(key);
  };
  const std::string system = need("system").get<std::string>();
  std::string impl;
  if (system.rfind("trex", 0) == 0) impl = "trex";
  else if (system.rfind("hf-transformers", 0) == 0) impl = "hf_baseline";
  else TREX_CHECK(false, "plan-record: {}: unknown system '{}' (trex-* or hf-transformers*)", where, system);
  const std::string config = need("config").get<std::string>();
  const int64_t seq = need("seq").get<int64_t>(), batch = need("batch").get<int64_t>();
  int64_t gpus = line.value("gpus", int64_t(1));
  if (impl == "hf_baseline") {  // hf_baseline.py names its FSDP2 world in the system: hf-transformers-fsdp2xN
    const size_t x = system.rfind("fsdp2x");
    if (x != std::string::npos) gpus = std::stoll(system.substr(x + 6));
  }
  const std::string mesh = line.value("mesh", std::string("single"));
  std::string layout = planner_layout(mesh, gpus, batch);
  if (impl == "hf_baseline" && gpus > 1) layout = fmt::format("DP{},MBS{},ZERO=3", gpus, batch);
  // Sequences per step over all devices: DP ranks each take `batch` (bench convention), PP splits the batch.
  const bool pp = mesh.find("pp=") != std::string::npos;
  const int64_t gbs = pp ? batch : batch * gpus;
  const double tps_total = need("tokens_per_s").get<double>();
  const double tps_dev = line.value("tokens_per_s_per_gpu", tps_total / double(gpus));
  json measured = {{"step_s", need("step_s").get<double>()},
                   {"tokens_per_s_per_device", tps_dev}};
  if (line.contains("peak_gib")) measured["peak_gib"] = line["peak_gib"];
  if (line.contains("mfu")) measured["mfu"] = line["mfu"];
  if (line.contains("exposed_comm_ms")) measured["exposed_comm_ms"] = line["exposed_comm_ms"];
  if (line.contains("bubble")) measured["bubble"] = line["bubble"];
  std::string stem = config.substr(0, config.rfind('.'));
  const std::string launcher = line.value("launcher", std::string());
  std::string tag = mesh == "single" || mesh.empty() ? "" : "/" + mesh;
  if (launcher == "torchrun") tag += "/torchrun";  // same layout, other launcher: its own record
  json rec = {{"id", fmt::format("{}/{}/{}/s{}xb{}/{}gpu{}", impl, o.hardware, stem, seq, batch, gpus, tag)},
              {"implementation", impl},
              {"hardware", o.hardware},
              {"devices", gpus},
              {"model", "bench/" + config},
              {"layout", layout},
              {"seq", seq},
              {"gbs", gbs},
              {"mode", o.mode},
              {"optimizer", o.optimizer},
              {"precision", "bf16"},
              {"mtp", false},
              {"measured", measured},
              {"source", o.source}};
  return rec;
}

void run_record(const RecordOptions& o) {
  TREX_CHECK(!o.source.empty(), "plan-record: --source is required (which device call, which command)");
  std::ifstream file;
  std::istream* in = &std::cin;
  if (o.input != "-") {
    file.open(o.input);
    TREX_CHECK(file.good(), "plan-record: cannot read '{}'", o.input);
    in = &file;
  }
  std::vector<json> records;
  std::string text;
  int64_t lineno = 0;
  while (std::getline(*in, text)) {
    ++lineno;
    const size_t brace = text.find('{');
    if (brace == std::string::npos) continue;  // logs around the JSON lines are skipped
    json line;
    try {
      line = json::parse(text.substr(brace));
    } catch (const json::exception&) {
      continue;  // not a bench line
    }
    if (!line.is_object() || !line.contains("tokens_per_s") || !line.contains("system")) continue;
    records.push_back(to_record(line, o, fmt::format("{}:{}", o.input, lineno)));
  }
  TREX_CHECK(!records.empty(), "plan-record: no bench JSON line (with system and tokens_per_s) in '{}'", o.input);
  for (const auto& r : records) {
    trex::plan::parse_measurement(r, "plan-record");  // validate before writing anything
    std::cout << r.dump() << "\n";
  }
  if (o.dry_run) return;
  const std::string path =
      o.measurements.empty() ? (trex::source_dir() / "docs/measurements/measurements.jsonl").string() : o.measurements;
  if (o.replace) {
    // Drop older records with the same ids (a re-measurement of the same run supersedes the old one).
    std::vector<std::string> keep;
    std::ifstream old(path);
    std::string l;
    while (std::getline(old, l)) {
      if (l.empty()) continue;
      const auto j = json::parse(l);
      bool superseded = false;
      for (const auto& r : records) superseded |= j.value("id", "") == r["id"].get<std::string>();
      if (!superseded) keep.push_back(l);
    }
    std::string all;
    for (const auto& k : keep) all += k + "\n";
    trex::write_text_atomic(path, all);
  }
  for (const auto& r : records) trex::plan::append_measurement(path, r);
  fmt::print(stderr, "plan-record: {} record(s) appended to {}\n", records.size(), path);
}

const bool registered_record = trex::cli::register_command(
    {"plan-record", "append `trex bench train` / hf_baseline.py JSON lines to the planner's measurements",
     [](CLI::App& app) {
       auto o = std::make_shared<RecordOptions>();
       app.add_option("input", o->input, "file with the bench output (JSON lines among other lines), - = stdin")
           ->capture_default_str();
       app.add_option("--measurements", o->measurements, "JSONL to append to (default docs/measurements/measurements.jsonl)");
       app.add_option("--hardware", o->hardware, "hardware profile name of the run")->capture_default_str();
       app.add_option("--source", o->source, "where the numbers come from (device call, command)")->required();
       app.add_option("--mode", o->mode, "cpt or sft")->capture_default_str();
       app.add_option("--optimizer", o->optimizer, "adamw or muon")->capture_default_str();
       app.add_flag("--replace", o->replace, "drop earlier records with the same id first");
       app.add_flag("--dry-run", o->dry_run, "print the records, write nothing");
       app.callback([o] { run_record(*o); });
     }});

}  // namespace
