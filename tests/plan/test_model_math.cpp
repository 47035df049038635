// Parameter counts and FLOPs per token against design/deepseek-v4.md §4.1 and §4.3, and the config
// reader's two dialects.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/param_table.h"
#include "plan/model_math.h"

using namespace trex::plan;

namespace {

void expect_rel(double got, double want, double rel, const char* what) {
  EXPECT_NEAR(got / want, 1.0, rel) << what << ": got " << got << ", want " << want;
}

}  // namespace

TEST(PlanModelMath, FlopsPerTokenReproduceDesignTable) {
  // design/deepseek-v4.md §4.3 (GFLOP per token, training = 3 x forward), within 0.5%.
  struct Row {
    const char* model;
    int64_t seq;
    bool mtp;
    double gflop;
  } rows[] = {{"flash", 4096, false, 85.6},  {"flash", 4096, true, 91.1},  {"flash", 32768, false, 91.2},
              {"flash", 32768, true, 96.6},  {"pro", 4096, false, 312.5},  {"pro", 4096, true, 324.3},
              {"pro", 32768, false, 331.2},  {"pro", 32768, true, 343.0}};
  for (const Row& r : rows) {
    ModelMath mm(model_preset(r.model), r.seq);
    SCOPED_TRACE(std::string(r.model) + " seq " + std::to_string(r.seq) + (r.mtp ? " mtp" : ""));
    expect_rel(mm.train_flops_per_token(r.mtp) / 1e9, r.gflop, 0.005, "training GFLOP/token");
  }
}

TEST(PlanModelMath, AttentionKeysMatchDesign) {
  // §4.2 concrete K-bar values: Flash S=4096: SWA 126.0, CSA 509.9, HCA 141.5; Pro S=32768 CSA 1087.8.
  ModelMath flash(model_preset("flash"), 4096);
  EXPECT_NEAR(flash.mean_keys(0), 126.0, 0.05);
  EXPECT_NEAR(flash.mean_keys(2), 509.9, 0.05);
  EXPECT_NEAR(flash.mean_keys(3), 141.5, 0.05);
  ModelMath pro(model_preset("pro"), 32768);
  EXPECT_NEAR(pro.mean_keys(2), 1087.8, 0.1);  // the design rounds its closed-form approximation
  EXPECT_NEAR(pro.mean_keys(3), 255.3, 0.05);
}

TEST(PlanModelMath, ParameterCountsReproduceDesign) {
  // §4.1, in billions, two decimals given: agree to 0.05%.
  ParamCounts f = ModelMath(model_preset("flash"), 4096).params();
  expect_rel(f.main_total / 1e9, 284.33, 5e-4, "flash total");
  expect_rel(f.mtp / 1e9, 6.61, 1e-3, "flash mtp");
  expect_rel((f.main_total + f.mtp) / 1e9, 290.94, 5e-4, "flash total incl. mtp");
  expect_rel(f.routed_main / 1e9, 277.03, 5e-4, "flash routed");
  expect_rel(f.activated / 1e9, 13.27, 1e-3, "flash activated");
  expect_rel(f.activated_with_embed / 1e9, 13.80, 1e-3, "flash activated incl. embedding");
  expect_rel(f.activated_with_mtp / 1e9, 13.59, 1e-3, "flash activated incl. mtp");
  ParamCounts p = ModelMath(model_preset("pro"), 4096).params();
  expect_rel(p.main_total / 1e9, 1572.99, 5e-4, "pro total");
  expect_rel(p.mtp / 1e9, 25.84, 1e-3, "pro mtp");
  expect_rel(p.routed_main / 1e9, 1547.40, 5e-4, "pro routed");
  expect_rel(p.activated / 1e9, 48.85, 1e-3, "pro activated");
  expect_rel(p.activated_with_mtp / 1e9, 49.72, 1e-3, "pro activated incl. mtp");
  // The 6N convention of §4.3: 79.6 (Flash) and 293.1 (Pro) GFLOP per token.
  expect_rel(ModelMath(model_preset("flash"), 4096).six_n_flops_per_token() / 1e9, 79.6, 1e-3, "flash 6N");
  expect_rel(ModelMath(model_preset("pro"), 4096).six_n_flops_per_token() / 1e9, 293.1, 1e-3, "pro 6N");
}

TEST(PlanModelMath, BenchConfigMatchesMeasuredThroughputTable) {
  // shared/bench/README.md: flash-l4 at 8192 x 1 ran 6,258 tokens/s = 66.2 model TFLOP/s, so the config's
  // FLOPs per token are 66.2e12 / 6258 = 10.58 GFLOP (rounding of the table: 0.1%).
  ModelSpec m = load_model_spec((trex::shared_dir() / "bench" / "flash-l4.json").string());
  EXPECT_EQ(m.n_layers, 4);
  EXPECT_EQ(m.count(AttnKind::Sliding), 2);
  EXPECT_NEAR(ModelMath(m, 8192).train_flops_per_token(false) / 1e9, 66.2e3 / 6258, 0.02);
}

TEST(PlanModelSpec, TransformersDialectAndErrors) {
  ModelSpec tiny = load_model_spec((trex::shared_dir() / "fixtures/deepseek-v4/tiny/config.json").string());
  ASSERT_EQ(tiny.n_layers, 5);
  EXPECT_EQ(tiny.attn[1], AttnKind::CSA);
  EXPECT_EQ(tiny.compress_ratio[2], 16);  // compress_rates.heavily_compressed_attention
  EXPECT_EQ(tiny.attn[2], AttnKind::HCA);
  EXPECT_EQ(tiny.n_hash_layers, 2);  // from mlp_layer_types

  nlohmann::json bad = {{"vocab_size", 10}};
  try {
    parse_model_spec(bad, "cfg.json");
    FAIL() << "expected an error";
  } catch (const trex::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: missing key 'hidden_size'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model_spec("no-such-model"), trex::Error);
}

// The released configs (shared/bench/v4-flash.json, v4-pro.json) through the planner read the model's parameter
// table: 284B and 1.6T with MTP (design §4.1), the presets agree with the files, and each block's split adds up to
// the table's tensors of that block.
TEST(PlanModelMath, ReleasedConfigsCountTheParameterTable) {
  struct Case {
    const char* file;
    const char* preset;
    double main_b, mtp_b;
  };
  for (const Case& c : {Case{"v4-flash.json", "flash", 284.33, 6.61}, Case{"v4-pro.json", "pro", 1572.99, 25.84}}) {
    SCOPED_TRACE(c.file);
    const auto path = trex::shared_dir() / "bench" / c.file;
    if (!trex::fs::exists(path)) GTEST_SKIP() << path << " not found";
    const ModelSpec spec = load_model_spec(path.string());
    const ModelMath mm(spec, 4096);
    const ParamCounts pc = mm.params();
    expect_rel(pc.main_total / 1e9, c.main_b, 5e-4, "main");
    expect_rel(pc.mtp / 1e9, c.mtp_b, 1e-3, "mtp");
    const ParamCounts preset = ModelMath(model_preset(c.preset), 4096).params();
    EXPECT_EQ(pc.main_total, preset.main_total);
    EXPECT_EQ(pc.mtp, preset.mtp);
    // Independent of the split: the table's weights (no hash tables) of each block.
    const trex::dsv4::ModelConfig cfg = model_config(spec);
    std::vector<double> per_block(size_t(spec.n_layers + 1), 0.0);
    for (const auto& s : trex::dsv4::param_table(cfg))
      if (s.in_block() && s.kind != trex::dsv4::ParamKind::HashTable)
        per_block[size_t(s.part == trex::dsv4::ParamPart::Mtp ? spec.n_layers : s.layer)] += double(trex::numel(s.shape));
    for (int64_t b = 0; b <= spec.n_layers; ++b) EXPECT_EQ(mm.block_params(b).total(), per_block[size_t(b)]) << b;
  }
}
