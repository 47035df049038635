// End to end through the CLI: `mpirun -np 2|4 trex train` of a tiny DeepSeek-V4 with pipeline, data (ZeRO-1,
// AdamW and Muon) and expert parallel layouts gives, step by step, the losses of the one-process run of the same
// config without its parallel section (the same global batch), within 1e-5 relative. Also: impossible layouts
// are refused with the mesh's reason, and a one-process parallel section trains like the plain trainer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/config.h"
#include "train/cli_test_util.h"
#include "train/metrics.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using trex::testing::mpirun;
using trex::testing::sh;
using trex::testing::tiny_cli_model;

struct RunDir {
  fs::path dir;
  std::string bin = TREX_BINARY;
  std::string error;
  int64_t vocab = 0;
  RunDir() {
    dir = fs::temp_directory_path() / ("trex_dist_train_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    error = trex::testing::prepare_tiny_corpus(dir, bin);
    if (error.empty()) vocab = 300;
  }
  ~RunDir() { fs::remove_all(dir); }

  // A run config: the tiny model, 4 micro-batches of 2 rows per step, 3 steps.
  fs::path config(const std::string& name, const std::string& optimizer, const json& parallel, int accum = 4) const {
    json c = {{"seed", 7},
              {"model", {{"type", "dsv4"}, {"dsv4", tiny_cli_model(vocab)}}},
              {"data", {{"shards", (dir / "shards").string()}, {"tokenizer", (dir / "tok.json").string()},
                        {"seq_len", 32}, {"batch_size", 2}, {"grad_accum", accum}}},
              {"optimizer", {{"kind", optimizer}}},
              {"schedule", {{"lr", 0.003}, {"min_lr", 0.0003}, {"warmup_steps", 1}}},
              {"train", {{"max_steps", 3}}},
              {"logging", {{"plot", false}}}};
    if (!parallel.is_null()) c["parallel"] = parallel;
    const fs::path p = dir / (name + ".json");
    std::ofstream(p) << c.dump(2);
    return p;
  }
  std::vector<double> losses(const fs::path& run) const {
    std::vector<double> l;
    for (const auto& j : trex::train::read_jsonl(run / "metrics.jsonl")) l.push_back(j["loss"].get<double>());
    return l;
  }
  // Trains `config` (under mpirun when np > 0) into DIR/<name>; returns the per-step losses.
  std::vector<double> train(const std::string& name, const fs::path& cfg, int np, std::string* out) const {
    const fs::path run = dir / ("run_" + name);
    fs::remove_all(run);
    const std::string cmd = (np > 0 ? mpirun(np) : std::string()) + bin + " train " + cfg.string() + " --out " +
                            run.string() + " --no-progress";
    const int rc = sh(cmd, out);
    if (rc != 0) {
      *out = "exit " + std::to_string(rc) + " from: " + cmd + "\n" + *out;
      return {};
    }
    return losses(run);
  }
};

RunDir& rundir() {
  static RunDir s;
  return s;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 1e-5 * std::abs(ref[i])) << what << ": step " << i + 1;
}

bool have_mpirun() { return sh("command -v mpirun") == 0; }

}  // namespace

TEST(DistributedTrain, LayoutsMatchTheSingleProcessRun) {
  RunDir& s = rundir();
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_TRUE(have_mpirun()) << "mpirun not found (scripts/setup.sh installs openmpi-bin)";
  std::string out;
  std::map<std::string, std::vector<double>> ref;
  for (const char* opt : {"adamw", "muon"}) {
    ref[opt] = s.train(std::string("ref_") + opt, s.config(std::string("ref_") + opt, opt, json()), 0, &out);
    ASSERT_EQ(ref[opt].size(), 3u) << out;
  }
  // The reference losses change over the steps (the runs train), or equality would prove little.
  EXPECT_NE(ref["adamw"][0], ref["adamw"][2]);
  struct Layout {
    std::string name, opt;
    int np;
    json parallel;
  };
  const std::vector<Layout> layouts = {
      {"pp2", "adamw", 2, {{"pp", 2}}},
      {"dp2_adamw", "adamw", 2, {{"dp", 2}}},
      {"dp2_muon", "muon", 2, {{"dp", 2}}},
      {"dp2_ep2", "muon", 2, {{"dp", 2}, {"ep", 2}}},
      {"pp2_vpp2", "adamw", 2, {{"pp", 2}, {"vpp", 2}, {"schedule", "interleaved"}}},
      {"pp2_dp2_ep2", "muon", 4, {{"pp", 2}, {"dp", 2}, {"ep", 2}}},
  };
  for (const Layout& l : layouts) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> got = s.train(l.name, s.config(l.name, l.opt, l.parallel), l.np, &out);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(got.size(), 3u) << l.name << "\n" << out;
    expect_same_losses(got, ref[l.opt], l.name + " (" + l.opt + ")");
    if (l.parallel.contains("pp"))  // pipelined runs report their bubble and exposed communication per step
      for (const auto& j : trex::train::read_jsonl(s.dir / ("run_" + l.name) / "metrics.jsonl")) {
        EXPECT_GE(j.value("pipeline_bubble_s", -1.0), 0.0) << l.name;
        EXPECT_GE(j.value("exposed_comm_s", -1.0), 0.0) << l.name;
        EXPECT_GT(j.value("bubble_fraction", 0.0), 0.0) << l.name;
      }
    EXPECT_LT(secs, 60.0) << l.name;
  }
}

TEST(DistributedTrain, OneProcessParallelSectionMatchesTheTrainer) {
  RunDir& s = rundir();
  ASSERT_TRUE(s.error.empty()) << s.error;
  std::string out;
  std::vector<double> ref = s.train("ref1", s.config("ref1", "muon", json()), 0, &out);
  ASSERT_EQ(ref.size(), 3u) << out;
  std::vector<double> got = s.train("one", s.config("one", "muon", {{"pp", 1}, {"dp", 1}}), 0, &out);
  ASSERT_EQ(got.size(), 3u) << out;
  expect_same_losses(got, ref, "pp=1 dp=1 in one process");
  EXPECT_TRUE(fs::exists(s.dir / "run_one" / "checkpoints")) << "a one-process layout writes checkpoints";
}

TEST(DistributedTrain, ImpossibleLayoutsAreRefused) {
  RunDir& s = rundir();
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_TRUE(have_mpirun());
  std::string out;
  // 3 experts per EP rank do not divide 4 experts.
  s.train("bad_ep", s.config("bad_ep", "adamw", {{"dp", 2}, {"ep", 3}}), 2, &out);
  EXPECT_NE(out.find("does not divide"), std::string::npos) << out;
  // pp x dp != processes.
  s.train("bad_world", s.config("bad_world", "adamw", {{"pp", 2}, {"dp", 2}}), 2, &out);
  EXPECT_NE(out.find("but 2 processes were launched"), std::string::npos) << out;
  // Interleaving needs the micro-batches per DP rank to be a multiple of pp.
  s.train("bad_il", s.config("bad_il", "adamw", {{"pp", 2}, {"vpp", 2}}, 3), 2, &out);
  EXPECT_NE(out.find("multiple of pp"), std::string::npos) << out;
  // micro_batches x dp must agree with data.grad_accum.
  s.train("bad_mb", s.config("bad_mb", "adamw", {{"dp", 2}, {"micro_batches", 3}}), 2, &out);
  EXPECT_NE(out.find("micro-batches per step"), std::string::npos) << out;
}

TEST(DistributedConfig, ParsesAndChecksTheParallelSection) {
  using namespace trex::train;
  auto parse = [](const std::string& par, int64_t accum = 4) {
    json j = {{"model", {{"type", "toy"}}}, {"data", {{"shards", "s"}, {"tokenizer", "t"}, {"grad_accum", accum}}}};
    if (!par.empty()) j["parallel"] = json::parse(par);
    return parse_train_config(j, "cfg.yaml");
  };
  TrainConfig c = parse("");
  EXPECT_FALSE(c.parallel.present);
  c = parse(R"({"pp": 2, "dp": 2, "ep": 2, "vpp": 2, "schedule": "interleaved"})");
  EXPECT_TRUE(c.parallel.present);
  EXPECT_EQ(c.parallel.mesh.pp, 2);
  EXPECT_EQ(c.parallel.mesh.vpp, 2);
  EXPECT_EQ(c.parallel.schedule, trex::parallel::ScheduleKind::Interleaved);
  EXPECT_EQ(check_parallel_config(c, 4, {4, 4}), "");
  EXPECT_NE(check_parallel_config(c, 8, {4, 4}).find("processes were launched"), std::string::npos);
  EXPECT_NE(check_parallel_config(c, 4, {4, 3}).find("does not divide the 3 routed experts"), std::string::npos);
  EXPECT_NE(check_parallel_config(c, 4, {3, 4}).find("for only 3 layers"), std::string::npos);
  c = parse(R"({"pp": 2, "dp": 2, "vpp": 2})", 2);  // 1 micro-batch per DP rank: not a multiple of pp
  EXPECT_NE(check_parallel_config(c, 4, {4, 4}).find("multiple of pp"), std::string::npos);
  c = parse(R"({"dp": 4})", 6);
  EXPECT_NE(check_parallel_config(c, 4, {4, 4}).find("cannot be dealt evenly"), std::string::npos);
  c = parse(R"({"pp": 2, "vpp": 2, "schedule": "1f1b"})");
  EXPECT_NE(check_parallel_config(c, 2, {4, 4}).find("interleaved"), std::string::npos);
  // micro_batches sets grad_accum = micro_batches x dp.
  json j = {{"model", {{"type", "toy"}}}, {"data", {{"shards", "s"}, {"tokenizer", "t"}}},
            {"parallel", {{"dp", 2}, {"micro_batches", 3}}}};
  EXPECT_EQ(parse_train_config(j, "x").grad_accum, 6);
  EXPECT_THROW(parse(R"({"dp": 2, "micro_batches": 3})"), trex::Error);  // data.grad_accum 4 disagrees
  EXPECT_EQ(parse(R"({"tp": 2})").parallel.mesh.tp, 2);       // tensor parallel: the GPU trainer's
  EXPECT_THROW(parse(R"({"cp": 2})"), trex::Error);            // no context parallelism: an unknown key
  EXPECT_THROW(parse(R"({"pp": 2, "schedule": "gpipe"})"), trex::Error);
}
