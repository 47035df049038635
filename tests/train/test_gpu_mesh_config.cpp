// What `trex train --device cuda` runs (train/gpu_mesh_config.h): one GPU and dp (ZeRO-1) with the V4 recipe
// (AdamW or Muon, the balance loss, freeze, MTP), ep folded into dp, and pipeline stages with dp / ep (without
// MTP and the balance loss) are accepted; every layout the GPU mesh engine does not run is
// refused on the config alone, naming the key to change and what is missing.
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
}

// Any data-parallel degree: the ZeRO-1 buckets are padded to a multiple of 8 x dp elements (gpu_params_cuda.cpp).
TEST(GpuMeshConfig, AcceptsAnyDataParallelDegree) {
  for (int dp : {3, 6, 128})
    EXPECT_EQ(check_gpu_mesh_config(config("parallel: {dp: " + std::to_string(dp) + "}\n"), dp), "") << dp;
}

TEST(GpuMeshConfig, RefusesWhatTheGpuMeshDoesNotRunNamingWhatIsMissing) {
  // On pipeline stages: interleaving, the MTP module, the balance loss (the default weight too).
  expect_refused(config("parallel: {pp: 2, dp: 1, vpp: 2}\n"), 2, {"parallel.vpp=2", "vpp: 1"});
  expect_refused(config("parallel: {pp: 2, dp: 1}\n", "{kind: adamw}",
                        "{type: dsv4, balance_alpha: 0, dsv4: {num_nextn_predict_layers: 1}}"),
                 2, {"MTP", "parallel.pp=2", "embed.weight", "use_mtp: false"});
  expect_refused(config("parallel: {pp: 2, dp: 2}\n", "{kind: adamw}", "{type: dsv4, balance_alpha: 0.001}"), 4,
                 {"balance_alpha=0.001", "parallel.pp=2", "pp: 1"});
  expect_refused(config("parallel: {pp: 2, dp: 1}\n", "{kind: adamw}", "{type: dsv4}"), 2, {"balance_alpha"});
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
  auto ask = [](int64_t pp, int64_t vpp, int64_t ep, int64_t dp, bool muon, bool freeze, bool mtp = false,
                int64_t tp = 1) {
    GpuLayoutAsk a;
    a.pp = pp, a.vpp = vpp, a.ep = ep, a.dp = dp, a.muon = muon, a.freeze = freeze, a.mtp = mtp, a.tp = tp;
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
  const char* balance = "{type: dsv4, balance_alpha: 0.0001}";  // the trainer's default alpha
  auto with_balance = [](GpuLayoutAsk a) {
    a.balance_loss = true;
    return a;
  };
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
      // Tensor parallelism, alone and with dp / ep / pp, MTP, freeze, recomputation; not with Muon.
      {"parallel: {dp: 1, tp: 2}\n", "", "", 2, ask(1, 1, 1, 1, false, false, false, 2)},
      {"parallel: {dp: 2, tp: 4}\n", "", "", 8, ask(1, 1, 1, 2, false, false, false, 4)},
      {"parallel: {dp: 4, ep: 2, tp: 2}\n", "", "", 8, ask(1, 1, 2, 4, false, false, false, 2)},
      {"parallel: {pp: 2, dp: 2, tp: 2}\n", "", "", 8, ask(2, 1, 1, 2, false, false, false, 2)},
      {"freeze: [router]\nparallel: {dp: 2, tp: 2}\n", "", mtp, 4, ask(1, 1, 1, 2, false, true, true, 2)},
      {"recompute: full\nparallel: {dp: 2, tp: 2}\n", "", "", 4, recompute(ask(1, 1, 1, 2, false, false, false, 2))},
      {"parallel: {dp: 2, tp: 2}\n", "{kind: muon}", "", 4, ask(1, 1, 1, 2, true, false, false, 2)},
      // ZeRO-3 (fully sharded dense weights) with dp, dp x ep, pp x dp, tp, MTP, recomputation; not with Muon.
      {"parallel: {dp: 2, zero: 3}\n", "", "", 2, zero3(ask(1, 1, 1, 2, false, false))},
      {"parallel: {dp: 4, ep: 2, zero: 3}\n", "", "", 4, zero3(ask(1, 1, 2, 4, false, false))},
      {"parallel: {pp: 2, dp: 2, zero: 3}\n", "", "", 4, zero3(ask(2, 1, 1, 2, false, false))},
      {"freeze: [router]\nparallel: {dp: 2, zero: 3}\n", "", mtp, 2, zero3(ask(1, 1, 1, 2, false, true, true))},
      {"recompute: full\nparallel: {dp: 2, zero: 3}\n", "", "", 2, zero3(recompute(ask(1, 1, 1, 2, false, false)))},
      {"parallel: {dp: 2, zero: 3}\n", "{kind: muon}", "", 2, zero3(ask(1, 1, 1, 2, true, false))},
      {"parallel: {dp: 2, tp: 2, zero: 3}\n", "", "", 4, zero3(ask(1, 1, 1, 2, false, false, false, 2))},
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
  EXPECT_EQ(gpu_layout_gaps(tp), "Muon under tensor parallelism (a TP-split matrix is not orthogonalised whole)");
  GpuLayoutAsk z3;
  z3.dp = 8, z3.ep = 8, z3.zero = 3, z3.fully_sharded = true, z3.recompute = true;
  EXPECT_EQ(gpu_layout_gaps(z3), "");  // fully sharded dense weights run on the GPU
  z3.tp = 2;
  EXPECT_EQ(gpu_layout_gaps(z3), "");  // with tensor parallelism too
}

// Tensor parallelism is refused on the config when it cannot split the model, with the numbers, and with Muon.
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
  expect_refused(config("parallel: {dp: 2, tp: 2}\n", "{kind: muon}", model), 4,
                 {"Muon", "parallel.tp=2", "adamw"});
  // The CPU trainer's config check still takes tp (the GPU model runs it); the world is pp x dp x tp.
  const TrainConfig c = config("parallel: {dp: 2, tp: 2}\n");
  EXPECT_EQ(c.parallel.mesh.tp, 2);
  EXPECT_EQ(check_parallel_config(c, 4, {2, 8}), "");
  EXPECT_NE(check_parallel_config(c, 2, {2, 8}).find("dp=2 x tp=2 = 4 ranks"), std::string::npos);
}

// Dense partitioning (issue 17): parallel.zero 1 (default), 2 and 3 (fully sharded weights) run on the GPU with
// fp32 or bf16 reduction; Muon with zero 2 or 3 is refused with the key to change, and the planner's gaps say
// the same.
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
  expect_refused(config("parallel: {dp: 2, zero: 3}\n", "{kind: muon}"), 2, {"parallel.zero 3", "muon", "adamw"});
  expect_refused(config("parallel: {dp: 2, zero: 2}\n", "{kind: muon}"), 2, {"parallel.zero 2", "muon", "adamw"});
  EXPECT_THROW(config("parallel: {dp: 2, zero: 4}\n"), Error);
  EXPECT_THROW(config("parallel: {dp: 2, zero: 0}\n"), Error);
  EXPECT_THROW(config("parallel: {dp: 2, grad_reduce_dtype: fp16}\n"), Error);

  GpuLayoutAsk a;
  a.dp = 8;
  a.zero = 2;
  EXPECT_EQ(gpu_layout_gaps(a), "");
  a.muon = true;
  EXPECT_NE(gpu_layout_gaps(a).find("Muon with sharded gradients"), std::string::npos) << gpu_layout_gaps(a);
  a.muon = false, a.zero = 3;
  EXPECT_EQ(gpu_layout_gaps(a), "");
  a.muon = true;
  EXPECT_EQ(gpu_layout_gaps(a), "Muon with fully sharded weights (ZeRO-3 keeps no whole-matrix gradients)");
}
