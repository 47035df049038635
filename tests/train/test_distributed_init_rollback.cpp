// End to end through the CLI under `mpirun -np 2`: (a) an SFT run started with model.init_from_run from a CPT run
// trained at dp=2 (sharded checkpoint) begins, at pp=2, from the same weights as the one-process run does (its
// first-step loss equals the one-process run's); (b) a loss spike with `spike.action: rollback` at dp=2 reloads
// the newest sharded checkpoint (weights and ZeRO-1 state) and continues past the offending batch, giving the
// one-process trainer's losses step by step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/cli_test_util.h"
#include "train/metrics.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using trex::testing::mpirun;
using trex::testing::sh;
using trex::testing::tiny_cli_model;

struct Dir {
  fs::path dir;
  std::string bin = TREX_BINARY, error;
  Dir() {
    dir = fs::temp_directory_path() / ("trex_dist_init_rb_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    error = trex::testing::prepare_tiny_corpus(dir, bin);
  }
  ~Dir() { fs::remove_all(dir); }
  fs::path config(const std::string& name, json extra) const {
    json c = {{"seed", 7},
              {"model", {{"type", "dsv4"}, {"dsv4", tiny_cli_model(300)}}},
              {"data", {{"shards", (dir / "shards").string()}, {"tokenizer", (dir / "tok.json").string()},
                        {"seq_len", 32}, {"batch_size", 2}, {"grad_accum", 4}}},
              {"optimizer", {{"kind", "adamw"}}},
              {"schedule", {{"lr", 0.003}, {"min_lr", 0.0003}, {"warmup_steps", 1}}},
              {"train", {{"max_steps", 3}}},
              {"logging", {{"plot", false}}}};
    c.merge_patch(extra);
    const fs::path p = dir / (name + ".json");
    std::ofstream(p) << c.dump(2);
    return p;
  }
  // Trains into DIR/run_<name> (under mpirun when np > 0); returns the per-step losses (empty on failure).
  std::vector<double> train(const std::string& name, const fs::path& cfg, int np, std::string* out) const {
    const fs::path run = dir / ("run_" + name);
    fs::remove_all(run);
    const std::string cmd = (np > 0 ? mpirun(np) : std::string()) + bin + " train " + cfg.string() + " --out " +
                            run.string() + " --no-progress";
    if (int rc = sh(cmd, out); rc != 0) {
      *out = "exit " + std::to_string(rc) + " from: " + cmd + "\n" + *out;
      return {};
    }
    std::vector<double> l;
    for (const auto& j : trex::train::read_jsonl(run / "metrics.jsonl")) l.push_back(j["loss"].get<double>());
    return l;
  }
};

Dir& fixture() {
  static Dir d;
  return d;
}

}  // namespace

TEST(DistributedInit, InitFromRunAtPp2MatchesTheOneProcessRun) {
  Dir& d = fixture();
  ASSERT_TRUE(d.error.empty()) << d.error;
  std::string out;
  // CPT at dp=2: a sharded checkpoint at its last step.
  std::vector<double> cpt = d.train("cpt", d.config("cpt", {{"parallel", {{"dp", 2}}}}), 2, &out);
  ASSERT_EQ(cpt.size(), 3u) << out;
  ASSERT_TRUE(fs::exists(d.dir / "run_cpt" / "checkpoints" / "step_00000003" / "manifest.json"));
  const json init = {{"model", {{"init_from_run", (d.dir / "run_cpt").string()}}}, {"train", {{"max_steps", 1}}}};
  std::vector<double> one = d.train("sft_one", d.config("sft_one", init), 0, &out);
  ASSERT_EQ(one.size(), 1u) << out;
  json init_pp = init;
  init_pp["parallel"] = {{"pp", 2}};
  std::vector<double> pp = d.train("sft_pp2", d.config("sft_pp2", init_pp), 2, &out);
  ASSERT_EQ(pp.size(), 1u) << out;
  EXPECT_NEAR(pp[0], one[0], 1e-5 * std::abs(one[0]));
  // The trained weights were loaded: a fresh start's first loss (the CPT run's, same seed and data) is higher.
  EXPECT_LT(one[0], cpt[0] - 1e-3);
}

TEST(DistributedRollback, SpikeRollbackAtDp2MatchesTheOneProcessRun) {
  Dir& d = fixture();
  ASSERT_TRUE(d.error.empty()) << d.error;
  // The losses fall monotonically (7.44, 6.03, 5.82, 5.64, 5.52, 5.42, ...) while their ratio to the mean of
  // the last two rises, so the thresholds force spikes: a loss above 0.975 x that mean counts (z disabled).
  // Step 7 spikes; each rollback goes to the step-4 checkpoint, re-trains steps 5 and 6 on the data past the
  // spiked batch (so from the reloaded weights and reloaded optimiser moments) and spikes at step 7 again, until
  // max_rollbacks gives up. So the dp=2 run (sharded checkpoints, ZeRO-1) reports the one-process trainer's
  // losses, spike by spike, only if every rank reloads its parameters and optimiser state and the data
  // position continues as the trainer's does.
  const json spiky = {{"train", {{"max_steps", 7}}},
                      {"checkpoint", {{"every", 4}, {"keep_last", 2}}},
                      {"spike", {{"action", "rollback"}, {"min_history", 2}, {"window", 2}, {"z_threshold", -100.0},
                                 {"min_ratio", 0.975}, {"max_rollbacks", 3}}}};
  json dp = spiky;
  dp["parallel"] = {{"dp", 2}};
  struct Seen {
    std::vector<double> losses, spikes;
    std::vector<int64_t> to_steps;
  };
  auto run = [&](const std::string& name, const json& extra, int np) {
    std::string out;
    const fs::path r = d.dir / ("run_" + name);
    const std::string cmd = (np > 0 ? mpirun(np) : std::string()) + d.bin + " train " +
                            d.config(name, extra).string() + " --out " + r.string() + " --no-progress";
    EXPECT_NE(sh(cmd, &out), 0) << name << ": the fourth spike should end the run\n" << out;
    EXPECT_NE(out.find("after 3 rollbacks: giving up"), std::string::npos) << name << "\n" << out;
    Seen s;
    for (const auto& j : trex::train::read_jsonl(r / "metrics.jsonl")) s.losses.push_back(j["loss"].get<double>());
    for (const auto& e : trex::train::read_jsonl(r / "events.jsonl"))
      if (e.value("event", "") == "spike") {
        s.spikes.push_back(e["loss"].get<double>());
        s.to_steps.push_back(e.value("to_step", int64_t(-1)));
      }
    return s;
  };
  const Seen one = run("rb_one", spiky, 0), got = run("rb_dp2", dp, 2);
  ASSERT_EQ(one.losses.size(), 6u);  // steps 1-6 (5 and 6 from the last retry); step 7 never got past its spikes
  ASSERT_EQ(one.spikes.size(), 3u);
  EXPECT_EQ(one.to_steps, (std::vector<int64_t>{4, 4, 4}));
  EXPECT_NE(one.spikes[0], one.spikes[1]);  // each retry trains on new data
  ASSERT_EQ(got.losses.size(), one.losses.size());
  ASSERT_EQ(got.spikes.size(), one.spikes.size());
  EXPECT_EQ(got.to_steps, one.to_steps);
  for (size_t i = 0; i < one.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], one.losses[i], 1e-5 * std::abs(one.losses[i])) << "step " << i + 1;
  for (size_t i = 0; i < one.spikes.size(); ++i)
    EXPECT_NEAR(got.spikes[i], one.spikes[i], 1e-5 * std::abs(one.spikes[i])) << "spike " << i + 1;
}
