// What `trex train --device cuda` runs on several GPUs (train/gpu_mesh_config.h): dp (ZeRO-1) with AdamW, and
// ep folded into it, are accepted; every layout the GPU mesh engine does not run is refused on the config alone, naming the key to
// change and what is missing.
#include <gtest/gtest.h>

#include "train/config.h"
#include "train/gpu_mesh_config.h"
#include "train/yaml.h"

using namespace trex;
using namespace trex::train;

namespace {

TrainConfig config(const std::string& extra, const std::string& optimizer = "{kind: adamw}",
                   const std::string& model = "{type: dsv4, balance_alpha: 0}") {
  return parse_train_config(parse_yaml("seed: 1\nmodel: " + model +
                                           "\ndata: {shards: x, tokenizer: y, seq_len: 32, batch_size: 2, "
                                           "grad_accum: 4}\noptimizer: " + optimizer + "\n" + extra,
                                       "run.yaml"),
                            "run.yaml");
}

void expect_refused(const TrainConfig& c, int world, const std::vector<std::string>& words) {
  const std::string why = check_gpu_mesh_config(c, world);
  ASSERT_FALSE(why.empty()) << "accepted";
  for (const auto& w : words) EXPECT_NE(why.find(w), std::string::npos) << "'" << w << "' not in: " << why;
}

}  // namespace

TEST(GpuMeshConfig, AcceptsDataAndExpertParallelWithAdamW) {
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2}\n"), 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 4}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, ep: 2}\n"), 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 4, ep: 2}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config(""), 4), "") << "no parallel section: plain data parallelism";
  // One rank: Muon and the balance loss run as on one GPU.
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 1}\n", "{kind: muon}", "{type: dsv4}"), 1), "");
}

TEST(GpuMeshConfig, RefusesWhatTheGpuMeshDoesNotRunNamingWhatIsMissing) {
  expect_refused(config("parallel: {pp: 2, dp: 1}\n"), 2, {"parallel.pp=2", "gpu_pipeline.h", "pp: 1"});
  expect_refused(config("parallel: {pp: 2, dp: 1, vpp: 2}\n"), 2, {"parallel.pp=2"});
  expect_refused(config("freeze: [router]\nparallel: {dp: 2}\n"), 2, {"freeze"});
  expect_refused(config("parallel: {dp: 4, ep: 3}\n"), 4, {"parallel.ep=3", "parallel.dp=4", "does not divide"});
  expect_refused(config("parallel: {dp: 2}\n", "{kind: muon}"), 2, {"muon", "dp=2", "adamw"});
  expect_refused(config("parallel: {dp: 2}\n", "{kind: adamw, adamw: {decay_vectors: false}}"), 2,
                 {"decay_vectors"});
  expect_refused(config("parallel: {dp: 2}\n", "{kind: adamw}", "{type: dsv4}"), 2,
                 {"model.balance_alpha", "dp=2"});
  expect_refused(config("", "{kind: adamw}", "{type: dsv4}"), 2, {"model.balance_alpha"});
  expect_refused(config("parallel: {dp: 2}\n", "{kind: adamw}", "{type: toy}"), 2, {"dsv4 only", "toy"});
}

// The planner's report of what the GPU trainer runs (gpu_layout_gaps) and the trainer's own refusals
// (check_gpu_mesh_config) say the same thing for every layout both can express.
TEST(GpuMeshConfig, PlannerGapsAgreeWithTheTrainersRefusals) {
  struct Case {
    const char* parallel;
    const char* optimizer;
    const char* freeze;
    int world;
    GpuLayoutAsk ask;
  };
  auto ask = [](int64_t pp, int64_t vpp, int64_t ep, int64_t dp, bool muon, bool freeze) {
    GpuLayoutAsk a;
    a.pp = pp, a.vpp = vpp, a.ep = ep, a.dp = dp, a.muon = muon, a.freeze = freeze;
    return a;
  };
  const std::vector<Case> cases = {
      {"parallel: {dp: 2}\n", "", "", 2, ask(1, 1, 1, 2, false, false)},
      {"parallel: {dp: 4}\n", "", "", 4, ask(1, 1, 1, 4, false, false)},
      {"parallel: {dp: 3}\n", "", "", 3, ask(1, 1, 1, 3, false, false)},
      {"parallel: {dp: 128}\n", "", "", 128, ask(1, 1, 1, 128, false, false)},
      {"parallel: {pp: 2, dp: 1}\n", "", "", 2, ask(2, 1, 1, 1, false, false)},
      {"parallel: {pp: 2, dp: 1, vpp: 2}\n", "", "", 2, ask(2, 2, 1, 1, false, false)},
      {"parallel: {dp: 4, ep: 2}\n", "", "", 4, ask(1, 1, 2, 4, false, false)},
      {"parallel: {dp: 2, ep: 2}\n", "", "", 2, ask(1, 1, 2, 2, false, false)},
      {"parallel: {dp: 4, ep: 3}\n", "", "", 4, ask(1, 1, 3, 4, false, false)},
      {"parallel: {dp: 8, ep: 4}\n", "{kind: muon}", "", 8, ask(1, 1, 4, 8, true, false)},
      {"parallel: {dp: 2}\n", "{kind: muon}", "", 2, ask(1, 1, 1, 2, true, false)},
      {"parallel: {dp: 1}\n", "{kind: muon}", "", 1, ask(1, 1, 1, 1, true, false)},
      {"freeze: [router]\nparallel: {dp: 2}\n", "", "", 2, ask(1, 1, 1, 2, false, true)},
  };
  for (const Case& c : cases) {
    const TrainConfig cfg = c.optimizer[0] ? config(c.parallel, c.optimizer) : config(c.parallel);
    const bool refused = !check_gpu_mesh_config(cfg, c.world).empty();
    EXPECT_EQ(refused, !gpu_layout_gaps(c.ask).empty()) << c.parallel << c.optimizer << ": trainer says '"
                                                         << check_gpu_mesh_config(cfg, c.world) << "', planner '"
                                                         << gpu_layout_gaps(c.ask) << "'";
  }
  GpuLayoutAsk tp;
  tp.tp = 8, tp.recompute = true;
  EXPECT_EQ(gpu_layout_gaps(tp), "tensor parallelism; activation recomputation");
}
