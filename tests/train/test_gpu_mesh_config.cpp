// What `trex train --device cuda` runs (train/gpu_mesh_config.h): one GPU and dp (ZeRO-1) with the V4 recipe
// (AdamW or Muon, the balance loss, freeze, MTP), ep folded into dp, and pipeline stages with dp / ep, the V4
// recipe included (MTP on the last stage, each stage's balance terms), are accepted; every layout the GPU mesh
// engine does not run is refused on the config alone, naming the key to change and what is missing.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "train/config.h"
#include "train/gpu_mesh_config.h"
#include "train/tiny_gpu_config.h"
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

TEST(GpuMeshConfig, AcceptsOneGpuAndDataParallelWithTheV4Recipe) {
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2}\n"), 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 4}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, ep: 2}\n"), 2), "") << "ep = dp";
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 4, ep: 2}\n"), 4), "") << "dp = 2 x ep = 2";
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 8, ep: 2}\n"), 8), "") << "dp = 4 x ep = 2";
  EXPECT_EQ(check_gpu_mesh_config(config(""), 4), "") << "no parallel section: plain data parallelism";
  EXPECT_EQ(check_gpu_mesh_config(config(""), 1), "") << "one GPU";
  // One rank and dp: Muon (whole matrices under ZeRO-1), AdamW without decay on vectors, the balance loss, the
  // frozen router, the MTP module.
  const std::string mtp = "{type: dsv4, use_mtp: true, dsv4: {num_nextn_predict_layers: 1}}";
  for (int dp : {1, 2, 4}) {
    const std::string par = "parallel: {dp: " + std::to_string(dp) + "}\n";
    EXPECT_EQ(check_gpu_mesh_config(config(par, "{kind: muon}", "{type: dsv4}"), dp), "") << dp;
    EXPECT_EQ(check_gpu_mesh_config(config(par, "{kind: adamw, adamw: {decay_vectors: false}}"), dp), "") << dp;
    EXPECT_EQ(check_gpu_mesh_config(config("freeze: [\"layers.*.ffn.gate.weight\"]\n" + par), dp), "") << dp;
    EXPECT_EQ(check_gpu_mesh_config(config(par, "{kind: muon}", mtp), dp), "") << dp;
  }
  // Pipeline stages, alone and with dp; AdamW or Muon, freeze; the MTP config present but not trained.
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 1}\n"), 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2, ep: 2}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 4, dp: 2}\n", "{kind: muon}"), 8), "");
  EXPECT_EQ(check_gpu_mesh_config(config("freeze: [\"layers.*.ffn.gate.weight\"]\nparallel: {pp: 2, dp: 2}\n"), 4),
            "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 1}\n", "{kind: adamw}",
                                         "{type: dsv4, balance_alpha: 0, use_mtp: false, dsv4: "
                                         "{num_nextn_predict_layers: 1}}"),
                                  2),
            "");
  // The V4 recipe in every layout: MTP and the balance loss (the default weight too) with ep, on pipeline stages,
  // and on both at once (pp = 2 x dp = 2 x ep = 2).
  const std::string recipe = "{type: dsv4, dsv4: {num_nextn_predict_layers: 1}}";  // balance_alpha default 1e-4
  const std::string frozen = "freeze: [\"*.ffn.gate.weight\"]\n";
  for (const auto& [par, world] : std::vector<std::pair<std::string, int>>{
           {"parallel: {dp: 2, ep: 2}\n", 2}, {"parallel: {dp: 4, ep: 2}\n", 4}, {"parallel: {pp: 2, dp: 1}\n", 2},
           {"parallel: {pp: 2, dp: 2}\n", 4}, {"parallel: {pp: 2, dp: 4, ep: 2}\n", 8},
           {"parallel: {pp: 4, dp: 2, ep: 2}\n", 8}}) {
    EXPECT_EQ(check_gpu_mesh_config(config(frozen + par, "{kind: adamw}", recipe), world), "") << par;
    EXPECT_EQ(check_gpu_mesh_config(config(par, "{kind: adamw}", "{type: dsv4, balance_alpha: 0.001}"), world), "")
        << par;
  }
}

// Interleaved stages (vpp > 1) with dp and ep folded into it run on the GPU (train/cuda/gpu_pipeline.h); the
// no-op padding layers (parallel.pad_layers) must fill the layer slots evenly and leave the last stage a layer.
TEST(GpuMeshConfig, AcceptsInterleavedStagesAndRefusesPaddingThatDoesNotDivide) {
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 1, vpp: 2}\n"), 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2, vpp: 2}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2, ep: 2, vpp: 2}\n"), 4), "");
  auto with_layers = [](const std::string& par, int64_t layers) {
    TrainConfig c = config(par);
    nlohmann::json j = trex::testing::tiny_gpu_config_json();
    j["num_hidden_layers"] = layers;
    j["compress_ratios"] = std::vector<int>(size_t(layers), 0);
    c.model["dsv4"] = j;
    return c;
  };
  // 10 layers + 2 = 12 slots over pp 2 x vpp 2: 3 per virtual stage, the last one 1 layer + 2 no-op.
  EXPECT_EQ(check_gpu_mesh_config(with_layers("parallel: {pp: 2, vpp: 2, pad_layers: 2}\n", 10), 2), "");
  EXPECT_EQ(with_layers("parallel: {pp: 2, vpp: 2, pad_layers: 2}\n", 10).parallel.pad_layers, 2);
  // 10 + 1 = 11 slots do not divide into 4 stages: the message names the numbers and the padding that would.
  expect_refused(with_layers("parallel: {pp: 2, vpp: 2, pad_layers: 1}\n", 10), 2,
                 {"parallel.pad_layers 1", "10 layers", "11 layer slots", "pp=2 x vpp=2 = 4 stages",
                  "pad_layers 2"});
  // 5 + 3 = 8 slots: 2 per stage, and the last stage would hold no-op layers only.
  expect_refused(with_layers("parallel: {pp: 2, vpp: 2, pad_layers: 3}\n", 5), 2,
                 {"parallel.pad_layers 3", "without a layer", "fewer pad_layers"});
  EXPECT_EQ(check_pad_layers({2, 1, 1, 1}, 43, 1), "") << "the report's 43 + 1 layers on pp 2";
  EXPECT_EQ(check_pad_layers({4, 1, 1, 1}, 43, 1), "") << "the report's 43 + 1 layers on pp 4";
  EXPECT_NE(check_pad_layers({4, 1, 1, 2}, 43, 1), "") << "44 slots on 8 virtual stages";
  EXPECT_EQ(check_pad_layers({4, 1, 1, 2}, 43, 0), "") << "no padding: the layers split as they go";
  EXPECT_THROW(with_layers("parallel: {pp: 2, pad_layers: -1}\n", 4), Error);
  // The CPU trainer's check (distributed_run.cpp splits with the same padding) says the same.
  EXPECT_NE(check_parallel_config(with_layers("parallel: {pp: 2, vpp: 2, pad_layers: 1}\n", 10), 2, {10, 8})
                .find("11 layer slots"),
            std::string::npos);
  EXPECT_EQ(check_parallel_config(with_layers("parallel: {pp: 2, vpp: 2, pad_layers: 2}\n", 10), 2, {10, 8}), "");
}

// Any data-parallel degree: the ZeRO-1 buckets are padded to a multiple of 8 x dp elements (gpu_params_cuda.cpp).
TEST(GpuMeshConfig, AcceptsAnyDataParallelDegree) {
  for (int dp : {3, 6, 128})
    EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: " + std::to_string(dp) + "}\n"), dp), "") << dp;
}

TEST(GpuMeshConfig, RefusesWhatTheGpuMeshDoesNotRunNamingWhatIsMissing) {
  // Muon under TP at every zero level (a split matrix gathered over TP from its bucket's DP gather under 2 / 3).
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, tp: 2, zero: 2}\n", "{kind: muon}"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, tp: 2, zero: 3}\n", "{kind: muon}"), 4), "");
  expect_refused(config("parallel: {dp: 4, ep: 3}\n"), 4, {"parallel.ep=3", "parallel.dp=4", "does not divide"});
  expect_refused(config("parallel: {dp: 2}\n", "{kind: adamw}", "{type: toy}"), 2, {"dsv4 only", "toy"});
  expect_refused(config("", "{kind: adamw}", "{type: toy}"), 1, {"dsv4 only", "toy"});
}

// The planner's report of what the GPU trainer runs (gpu_layout_gaps) and the trainer's own refusals
// (check_gpu_mesh_config) say the same thing for every layout both can express.
TEST(GpuMeshConfig, PlannerGapsAgreeWithTheTrainersRefusals) {
  struct Case {
    const char* parallel;
    const char* optimizer;
    const char* model;
    int world;
    GpuLayoutAsk ask;
  };
  // (The MTP module and the balance loss run in every layout: the planner's ask has no field for them, and the
  // cases with them below must be accepted by the trainer too.)
  auto ask = [](int64_t pp, int64_t vpp, int64_t ep, int64_t dp, bool muon, bool freeze, bool mtp = false,
                int64_t tp = 1) {
    (void)mtp;
    GpuLayoutAsk a;
    a.pp = pp, a.vpp = vpp, a.ep = ep, a.dp = dp, a.muon = muon, a.freeze = freeze, a.tp = tp;
    return a;
  };
  const char* mtp = "{type: dsv4, balance_alpha: 0, dsv4: {num_nextn_predict_layers: 1}}";
  auto recompute = [](GpuLayoutAsk a) {
    a.recompute = true;
    return a;
  };
  auto zero3 = [](GpuLayoutAsk a) {
    a.zero = 3, a.fully_sharded = true;
    return a;
  };
  auto zero2 = [](GpuLayoutAsk a) {
    a.zero = 2;
    return a;
  };
  auto etp = [](GpuLayoutAsk a) {  // the routed experts split over the TP group too (etp = tp)
    a.etp = a.tp;
    return a;
  };
  const char* balance = "{type: dsv4, balance_alpha: 0.0001}";  // the trainer's default alpha
  auto with_balance = [](GpuLayoutAsk a) { return a; };
  const std::vector<Case> cases = {
      {"parallel: {dp: 2}\n", "", "", 2, ask(1, 1, 1, 2, false, false)},
      {"parallel: {dp: 4}\n", "", "", 4, ask(1, 1, 1, 4, false, false)},
      {"parallel: {dp: 3}\n", "", "", 3, ask(1, 1, 1, 3, false, false)},
      {"parallel: {dp: 128}\n", "", "", 128, ask(1, 1, 1, 128, false, false)},
      {"parallel: {pp: 2, dp: 1}\n", "", "", 2, ask(2, 1, 1, 1, false, false)},
      {"parallel: {pp: 2, dp: 1, vpp: 2}\n", "", "", 2, ask(2, 2, 1, 1, false, false)},
      {"parallel: {pp: 2, dp: 2}\n", "", "", 4, ask(2, 1, 1, 2, false, false)},
      {"parallel: {pp: 4, dp: 2}\n", "{kind: muon}", "", 8, ask(4, 1, 1, 2, true, false)},
      {"parallel: {pp: 2, dp: 2}\n", "", mtp, 4, ask(2, 1, 1, 2, false, false, true)},
      {"parallel: {pp: 2, dp: 3}\n", "", "", 6, ask(2, 1, 1, 3, false, false)},
      {"parallel: {pp: 2, dp: 4, ep: 2}\n", "", "", 8, ask(2, 1, 2, 4, false, false)},
      {"parallel: {dp: 4, ep: 2}\n", "", "", 4, ask(1, 1, 2, 4, false, false)},
      {"parallel: {dp: 2, ep: 2}\n", "", "", 2, ask(1, 1, 2, 2, false, false)},
      {"parallel: {dp: 4, ep: 3}\n", "", "", 4, ask(1, 1, 3, 4, false, false)},
      {"parallel: {dp: 2}\n", "{kind: muon}", "", 2, ask(1, 1, 1, 2, true, false)},
      {"parallel: {dp: 1}\n", "{kind: muon}", "", 1, ask(1, 1, 1, 1, true, false)},
      {"freeze: [router]\nparallel: {dp: 2}\n", "", "", 2, ask(1, 1, 1, 2, false, true)},
      {"freeze: [router]\nparallel: {dp: 4}\n", "{kind: muon}", mtp, 4, ask(1, 1, 1, 4, true, true, true)},
      {"parallel: {dp: 4, ep: 2}\n", "", mtp, 4, ask(1, 1, 2, 4, false, false, true)},
      {"", "{kind: muon}", mtp, 1, ask(1, 1, 1, 1, true, false, true)},
      {"recompute: full\nparallel: {dp: 2}\n", "", "", 2, recompute(ask(1, 1, 1, 2, false, false))},
      {"recompute: selective\nparallel: {dp: 2}\n", "", "", 2, recompute(ask(1, 1, 1, 2, false, false))},
      {"parallel: {dp: 2}\n", "", balance, 2, with_balance(ask(1, 1, 1, 2, false, false))},
      {"parallel: {dp: 4, ep: 2}\n", "", balance, 4, with_balance(ask(1, 1, 2, 4, false, false))},
      {"parallel: {pp: 2, dp: 2}\n", "", balance, 4, with_balance(ask(2, 1, 1, 2, false, false))},
      {"parallel: {pp: 2, dp: 4, ep: 2}\n", "", balance, 8, with_balance(ask(2, 1, 2, 4, false, false))},
      {"parallel: {pp: 2, dp: 4, ep: 2}\n", "", mtp, 8, ask(2, 1, 2, 4, false, false, true)},
      {"parallel: {pp: 2, dp: 1, vpp: 2}\n", "", mtp, 2, ask(2, 2, 1, 1, false, false, true)},
      // Tensor parallelism, alone and with dp / ep / pp, MTP, freeze, recomputation; Muon.
      {"parallel: {dp: 1, tp: 2}\n", "", "", 2, ask(1, 1, 1, 1, false, false, false, 2)},
      {"parallel: {dp: 2, tp: 4}\n", "", "", 8, ask(1, 1, 1, 2, false, false, false, 4)},
      {"parallel: {dp: 4, ep: 2, tp: 2}\n", "", "", 8, ask(1, 1, 2, 4, false, false, false, 2)},
      {"parallel: {pp: 2, dp: 2, tp: 2}\n", "", "", 8, ask(2, 1, 1, 2, false, false, false, 2)},
      {"freeze: [router]\nparallel: {dp: 2, tp: 2}\n", "", mtp, 4, ask(1, 1, 1, 2, false, true, true, 2)},
      {"recompute: full\nparallel: {dp: 2, tp: 2}\n", "", "", 4, recompute(ask(1, 1, 1, 2, false, false, false, 2))},
      {"parallel: {dp: 2, tp: 2}\n", "{kind: muon}", "", 4, ask(1, 1, 1, 2, true, false, false, 2)},
      // ZeRO-3 (fully sharded dense weights) with dp, dp x ep, pp x dp, tp, MTP, recomputation; AdamW or Muon.
      {"parallel: {dp: 2, zero: 3}\n", "", "", 2, zero3(ask(1, 1, 1, 2, false, false))},
      {"parallel: {dp: 4, ep: 2, zero: 3}\n", "", "", 4, zero3(ask(1, 1, 2, 4, false, false))},
      {"parallel: {pp: 2, dp: 2, zero: 3}\n", "", "", 4, zero3(ask(2, 1, 1, 2, false, false))},
      {"freeze: [router]\nparallel: {dp: 2, zero: 3}\n", "", mtp, 2, zero3(ask(1, 1, 1, 2, false, true, true))},
      {"recompute: full\nparallel: {dp: 2, zero: 3}\n", "", "", 2, zero3(recompute(ask(1, 1, 1, 2, false, false)))},
      {"parallel: {dp: 2, zero: 3}\n", "{kind: muon}", "", 2, zero3(ask(1, 1, 1, 2, true, false))},
      {"parallel: {dp: 2, tp: 2, zero: 3}\n", "", "", 4, zero3(ask(1, 1, 1, 2, false, false, false, 2))},
      {"parallel: {dp: 4, ep: 2, zero: 3}\n", "{kind: muon}", "", 4, zero3(ask(1, 1, 2, 4, true, false))},
      {"parallel: {dp: 2, tp: 2, zero: 3}\n", "{kind: muon}", "", 4, zero3(ask(1, 1, 1, 2, true, false, false, 2))},
      // Muon under tp with ZeRO-2: the bucket's DP gather, then the TP gather of its split matrices.
      {"parallel: {dp: 2, tp: 2, zero: 2}\n", "{kind: muon}", "", 4, zero2(ask(1, 1, 1, 2, true, false, false, 2))},
      // Expert tensor parallelism (etp = tp), with dp x ep, pp, MTP and freeze, ZeRO-2 Muon; etp other than 1 or tp
      // is refused.
      {"parallel: {dp: 4, ep: 2, tp: 2, etp: 2}\n", "", "", 8, etp(ask(1, 1, 2, 4, false, false, false, 2))},
      {"parallel: {pp: 2, dp: 2, ep: 2, tp: 2, etp: 2}\n", "", "", 8, etp(ask(2, 1, 2, 2, false, false, false, 2))},
      {"freeze: [router]\nparallel: {dp: 2, tp: 2, etp: 2}\n", "", mtp, 4, etp(ask(1, 1, 1, 2, false, true, true, 2))},
      {"parallel: {dp: 2, ep: 2, tp: 2, etp: 2, zero: 2}\n", "{kind: muon}", "", 4,
       zero2(etp(ask(1, 1, 2, 2, true, false, false, 2)))},
  };
  for (const Case& c : cases) {
    const TrainConfig cfg = config(c.parallel, c.optimizer[0] ? c.optimizer : "{kind: adamw}",
                                   c.model[0] ? c.model : "{type: dsv4, balance_alpha: 0}");
    const bool refused = !check_gpu_mesh_config(cfg, c.world).empty();
    EXPECT_EQ(refused, !gpu_layout_gaps(c.ask).empty()) << c.parallel << c.optimizer << ": trainer says '"
                                                         << check_gpu_mesh_config(cfg, c.world) << "', planner '"
                                                         << gpu_layout_gaps(c.ask) << "'";
  }
  GpuLayoutAsk tp;
  tp.tp = 8, tp.recompute = true;
  EXPECT_EQ(gpu_layout_gaps(tp), "");  // tensor parallelism and recomputation run on the GPU
  tp.muon = true;
  EXPECT_EQ(gpu_layout_gaps(tp), "");  // Muon gathers a TP-split matrix whole for its Newton-Schulz
  tp.zero = 2;
  EXPECT_EQ(gpu_layout_gaps(tp), "");  // the TP gather reads the bucket's transient DP gather
  GpuLayoutAsk z3;
  z3.dp = 8, z3.ep = 8, z3.zero = 3, z3.fully_sharded = true, z3.recompute = true;
  EXPECT_EQ(gpu_layout_gaps(z3), "");  // fully sharded dense weights run on the GPU
  z3.tp = 2;
  EXPECT_EQ(gpu_layout_gaps(z3), "");  // with tensor parallelism too
  z3.muon = true;
  EXPECT_EQ(gpu_layout_gaps(z3), "");  // Muon over fully sharded weights, with tp
  z3.etp = 2;
  EXPECT_EQ(gpu_layout_gaps(z3), "");  // with the routed experts split over the TP group too
  z3.etp = 4;
  EXPECT_EQ(gpu_layout_gaps(z3), "expert tensor parallelism other than etp = tp");  // what is missing is named
}

// Tensor parallelism is refused on the config when it cannot split the model, with the numbers; Muon runs with it.
TEST(GpuMeshConfig, RefusesTensorParallelSplitsThatDoNotDivide) {
  const std::string model = "{type: dsv4, balance_alpha: 0, dsv4: {vocab_size: 256, hidden_size: 64, "
                            "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 1, head_dim: 256, "
                            "qk_rope_head_dim: 64, q_lora_rank: 32, o_groups: 2, o_lora_rank: 16, "
                            "n_routed_experts: 8, num_experts_per_tok: 2, n_shared_experts: 1, "
                            "moe_intermediate_size: 32, index_n_heads: 4, index_head_dim: 64, index_topk: 4, "
                            "sliding_window: 16, compress_ratios: [0, 4], num_hash_layers: 0, hc_mult: 4}}";
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 1, tp: 2}\n", "{kind: adamw}", model), 2), "");
  expect_refused(config("parallel: {dp: 1, tp: 4}\n", "{kind: adamw}", model), 4,
                 {"parallel.tp=4", "2 output-projection groups"});
  expect_refused(config("parallel: {dp: 1, tp: 3}\n", "{kind: adamw}", model), 3,
                 {"parallel.tp=3", "4 attention query heads"});
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, tp: 2}\n", "{kind: muon}", model), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, tp: 2, etp: 2}\n", "{kind: muon}", model), 4), "");
  expect_refused(config("parallel: {dp: 2, tp: 2, etp: 4}\n", "{kind: adamw}", model), 4,
                 {"parallel.etp=4", "parallel.tp=2"});
  // The CPU trainer's config check still takes tp (the GPU model runs it); the world is pp x dp x tp.
  const TrainConfig c = config("parallel: {dp: 2, tp: 2}\n");
  EXPECT_EQ(c.parallel.mesh.tp, 2);
  EXPECT_EQ(check_parallel_config(c, 4, {2, 8}), "");
  EXPECT_NE(check_parallel_config(c, 2, {2, 8}).find("dp=2 x tp=2 = 4 ranks"), std::string::npos);
}

// Dense partitioning (issue 17): parallel.zero 1 (default), 2 and 3 (fully sharded weights) run on the GPU with
// fp32 or bf16 reduction; Muon runs at every level, with tp too; the planner's gaps say the same.
TEST(GpuMeshConfig, ZeroLevelsAndGradReduceDtype) {
  const TrainConfig def = config("parallel: {dp: 2}\n");
  EXPECT_EQ(def.parallel.zero, 1);
  EXPECT_EQ(def.parallel.grad_reduce_dtype, "fp32");
  const TrainConfig z2 = config("parallel: {dp: 2, zero: 2, grad_reduce_dtype: bf16}\n");
  EXPECT_EQ(z2.parallel.zero, 2);
  EXPECT_EQ(z2.parallel.grad_reduce_dtype, "bf16");
  EXPECT_EQ(check_gpu_mesh_config(z2, 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 4, ep: 2, zero: 2}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2, zero: 2}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, grad_reduce_dtype: bf16}\n", "{kind: muon}"), 2), "")
      << "bf16 reduction under ZeRO-1 keeps Muon's whole matrices";
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, zero: 3}\n"), 2), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2, ep: 2, zero: 3, grad_reduce_dtype: bf16}\n"), 4),
            "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, tp: 2, zero: 3}\n"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, zero: 3}\n", "{kind: muon}"), 2), "")
      << "Muon under ZeRO-3 takes ZeRO-2's per-bucket gather, each rank writing its own bf16 slice";
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {pp: 2, dp: 2, ep: 2, zero: 3}\n", "{kind: muon}"), 4), "");
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 2, zero: 2}\n", "{kind: muon}"), 2), "")
      << "Muon under ZeRO-2 gathers each bucket's Newton-Schulz inputs";
  EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: 4, ep: 2, zero: 2}\n", "{kind: muon}"), 4), "");
  EXPECT_THROW(config("parallel: {dp: 2, zero: 4}\n"), Error);
  EXPECT_THROW(config("parallel: {dp: 2, zero: 0}\n"), Error);
  EXPECT_THROW(config("parallel: {dp: 2, grad_reduce_dtype: fp16}\n"), Error);

  GpuLayoutAsk a;
  a.dp = 8;
  a.zero = 2;
  EXPECT_EQ(gpu_layout_gaps(a), "");
  a.muon = true;
  EXPECT_EQ(gpu_layout_gaps(a), "") << "Muon with ZeRO-2 runs";
  a.muon = false, a.zero = 3;
  EXPECT_EQ(gpu_layout_gaps(a), "");
  a.muon = true;
  EXPECT_EQ(gpu_layout_gaps(a), "") << "Muon with ZeRO-3 runs";
}
