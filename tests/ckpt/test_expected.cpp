// expected_tensors() shapes checked against the parameter totals of design §4.1 (computed there from
// the official shapes): Flash 284.33B main + 6.61B MTP, Pro 1572.99B main + 25.84B MTP.
#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "model/dsv4/checkpoint.h"

using namespace trex;
using namespace trex::dsv4;

namespace {

json full_model(bool pro) {
  json j = read_json_file(shared_dir() / "bench" / "flash-l4.json");
  json ratios = json::array();
  if (pro) {
    j.update({{"hidden_size", 7168},
              {"num_hidden_layers", 61},
              {"num_attention_heads", 128},
              {"q_lora_rank", 1536},
              {"o_groups", 16},
              {"n_routed_experts", 384},
              {"moe_intermediate_size", 3072},
              {"index_topk", 1024}});
    ratios = {128, 128};
    for (int i = 0; i < 29; ++i) ratios.insert(ratios.end(), {4, 128});
  } else {
    j.update({{"num_hidden_layers", 43}, {"n_routed_experts", 256}});
    ratios = {0, 0};
    for (int i = 0; i < 20; ++i) ratios.insert(ratios.end(), {4, 128});
  }
  ratios.insert(ratios.end(), {4, 0});  // last main layer, then the MTP block
  j["compress_ratios"] = ratios;
  j["num_nextn_predict_layers"] = 1;
  return j;
}

std::pair<double, double> billions(const ModelConfig& c) {
  double main = 0, mtp = 0;
  for (const auto& e : expected_tensors(c)) {
    if (e.dtype != DType::F32) continue;  // tid2eid is a table, not parameters
    (e.name.rfind("mtp.", 0) == 0 ? mtp : main) += double(numel(e.shape));
  }
  return {main / 1e9, mtp / 1e9};
}

}  // namespace

TEST(ExpectedTensors, FlashParameterCountMatchesDesign) {
  ModelConfig c = parse_model_config(full_model(false), "flash");
  EXPECT_EQ(c.compress_ratio.size(), 43u);
  auto [main, mtp] = billions(c);
  EXPECT_NEAR(main, 284.33, 0.01);
  EXPECT_NEAR(mtp, 6.61, 0.01);
}

TEST(ExpectedTensors, ProParameterCountMatchesDesign) {
  ModelConfig c = parse_model_config(full_model(true), "pro");
  auto [main, mtp] = billions(c);
  EXPECT_NEAR(main, 1572.99, 0.01);
  EXPECT_NEAR(mtp, 25.84, 0.01);
}

TEST(ExpectedTensors, FixtureKeySetIsExactlyTheConfigs) {
  ModelConfig c = load_model_config(test::fixture_dir() / "config.json");
  json fx = read_json_file(test::fixture_dir() / "fixture.json");
  // 145 stored tensors, of which 10 are expert stacks that unstack into 8 experts x 3 matrices.
  EXPECT_EQ(expected_tensors(c).size(), fx["params"].size() - 10 + 5 * 8 * 3);
}
