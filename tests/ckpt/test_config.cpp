// config.json parsing in both dialects, validation errors, and writing either dialect back.
#include <gtest/gtest.h>

#include "ckpt_test_util.h"
#include "model/dsv4/config.h"

using namespace trex;
using namespace trex::dsv4;
using trex::test::expect_error;

namespace {

json tiny_json() {
  return read_json_file(test::fixture_dir() / "config.json");
}
json bench_json(const char* name) {
  return read_json_file(shared_dir() / "bench" / name);
}

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  // Both dialect renderings agree exactly when every field agrees.
  EXPECT_EQ(model_config_to_json(a, Dialect::Transformers).dump(),
            model_config_to_json(b, Dialect::Transformers).dump());
  EXPECT_EQ(a.compress_ratio, b.compress_ratio);
  EXPECT_EQ(a.attn_types, b.attn_types);
  EXPECT_EQ(a.mlp_types, b.mlp_types);
  EXPECT_EQ(a.rope_dim, b.rope_dim);
  EXPECT_EQ(a.rope_compress.yarn, b.rope_compress.yarn);
  EXPECT_EQ(a.rope_compress.factor, b.rope_compress.factor);
  EXPECT_EQ(a.rope_compress.original_max_position, b.rope_compress.original_max_position);
  EXPECT_EQ(a.rope_main.theta, b.rope_main.theta);
  EXPECT_EQ(a.rope_compress.theta, b.rope_compress.theta);
}

}  // namespace

TEST(Config, TinyFixtureTransformersDialect) {
  ModelConfig c = load_model_config(test::fixture_dir() / "config.json");
  EXPECT_EQ(c.source_dialect, "transformers");
  EXPECT_EQ(c.vocab_size, 320);
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_dim, 8);  // qk_rope_head_dim 8 == 0.25 x 32
  EXPECT_EQ(c.q_lora_rank, 32);
  EXPECT_EQ(c.o_groups, 2);
  EXPECT_EQ(c.o_lora_rank, 16);
  EXPECT_EQ(c.window, 16);
  EXPECT_EQ(c.index_n_heads, 16);
  EXPECT_EQ(c.index_head_dim, 16);
  EXPECT_EQ(c.index_topk, 8);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.topk, 2);
  EXPECT_EQ(c.moe_inter, 32);
  EXPECT_DOUBLE_EQ(c.routed_scale, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 0.8);
  EXPECT_EQ(c.n_mtp, 0);
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{0, 4, 16, 4, 0}));
  EXPECT_EQ(c.attn_types, (std::vector<AttnType>{AttnType::Sliding, AttnType::CSA, AttnType::HCA,
                                                 AttnType::CSA, AttnType::Sliding}));
  EXPECT_EQ(c.mlp_types, (std::vector<MlpType>{MlpType::HashMoE, MlpType::HashMoE, MlpType::MoE, MlpType::MoE,
                                               MlpType::MoE}));
  EXPECT_EQ(c.n_hash_layers(), 2);
  EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0);
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 4.0);
  EXPECT_EQ(c.rope_compress.original_max_position, 64);
  EXPECT_DOUBLE_EQ(c.rope_compress.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.beta_slow, 1.0);
  EXPECT_EQ(&c.rope_for(0), &c.rope_main);
  EXPECT_EQ(&c.rope_for(2), &c.rope_compress);
}

TEST(Config, RopeDimFromPartialRotaryFactorWhenNoQkRopeHeadDim) {
  json j = tiny_json();
  j.erase("qk_rope_head_dim");
  EXPECT_EQ(parse_model_config(j, "t").rope_dim, 8);
  j.erase("partial_rotary_factor");  // still in rope_parameters.main
  EXPECT_EQ(parse_model_config(j, "t").rope_dim, 8);
}

TEST(Config, FlatRopeParametersDescribeTheCompressTable) {
  json j = tiny_json();
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 64},
                          {"beta_fast", 32},
                          {"beta_slow", 1}};
  ModelConfig c = parse_model_config(j, "flat");
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0);
  EXPECT_TRUE(c.rope_compress.yarn);
  EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_EQ(c.rope_compress.original_max_position, 64);
}

TEST(Config, FlashL4OfficialDialect) {
  ModelConfig c = load_model_config(shared_dir() / "bench" / "flash-l4.json");
  EXPECT_EQ(c.source_dialect, "official");
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.topk, 6);
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{0, 0, 4, 128}));
  EXPECT_EQ(c.attn_types,
            (std::vector<AttnType>{AttnType::Sliding, AttnType::Sliding, AttnType::CSA, AttnType::HCA}));
  EXPECT_EQ(c.mlp_types,
            (std::vector<MlpType>{MlpType::HashMoE, MlpType::HashMoE, MlpType::HashMoE, MlpType::MoE}));
  EXPECT_FALSE(c.rope_main.yarn);
  EXPECT_DOUBLE_EQ(c.rope_main.theta, 10000.0);
  EXPECT_TRUE(c.rope_compress.yarn);  // YaRN only on the compressed layers
  EXPECT_DOUBLE_EQ(c.rope_compress.theta, 160000.0);
  EXPECT_DOUBLE_EQ(c.rope_compress.factor, 16.0);
  EXPECT_EQ(c.rope_compress.original_max_position, 65536);
  EXPECT_EQ(c.max_position, 1048576);
}

TEST(Config, SmallS6OfficialDialect) {
  ModelConfig c = load_model_config(shared_dir() / "bench" / "small-s6.json");
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{128, 128, 128, 4, 128, 4}));
  EXPECT_EQ(c.attn_types, (std::vector<AttnType>{AttnType::HCA, AttnType::HCA, AttnType::HCA, AttnType::CSA,
                                                 AttnType::HCA, AttnType::CSA}));
  EXPECT_EQ(c.n_hash_layers(), 3);
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.o_groups, 4);
}

TEST(Config, OfficialCompressRatiosIncludeTheMtpEntry) {
  json j = bench_json("flash-l4.json");
  j["num_nextn_predict_layers"] = 1;
  expect_error([&] { parse_model_config(j, "flash-mtp.json"); },
               {"flash-mtp.json", "compress_ratios", "4 entries"});
  j["compress_ratios"] = {0, 0, 4, 128, 0};
  ModelConfig c = parse_model_config(j, "flash-mtp.json");
  EXPECT_EQ(c.n_mtp, 1);
  EXPECT_EQ(c.compress_ratio.size(), 4u);
  j["compress_ratios"] = {0, 0, 4, 128, 4};
  expect_error([&] { parse_model_config(j, "flash-mtp.json"); }, {"compress_ratios[4]", "MTP"});
}

TEST(Config, RoundTripBothDialects) {
  for (const ModelConfig& c : {load_model_config(test::fixture_dir() / "config.json"),
                               load_model_config(shared_dir() / "bench" / "flash-l4.json"),
                               load_model_config(shared_dir() / "bench" / "small-s6.json")}) {
    for (Dialect d : {Dialect::Official, Dialect::Transformers}) {
      json j = model_config_to_json(c, d);
      ModelConfig back = parse_model_config(j, "roundtrip");
      EXPECT_EQ(back.source_dialect, d == Dialect::Official ? "official" : "transformers");
      expect_same(c, back);
    }
  }
}

TEST(Config, OfficialDialectRejectsWhatItCannotExpress) {
  ModelConfig c = load_model_config(test::fixture_dir() / "config.json");
  c.compress_ratio[1] = 8;  // a CSA layer with ratio 8: official files mean CSA only by ratio 4
  c.compress_ratio[3] = 8;
  expect_error([&] { model_config_to_json(c, Dialect::Official); }, {"layer 1", "CSA", "ratio 8"});
  ModelConfig h = load_model_config(test::fixture_dir() / "config.json");
  h.mlp_types = {MlpType::MoE, MlpType::HashMoE, MlpType::MoE, MlpType::MoE, MlpType::MoE};
  expect_error([&] { model_config_to_json(h, Dialect::Official); }, {"hash-routed"});
}

struct BadCase {
  const char* what;
  std::function<void(json&)> mutate;
  std::vector<std::string> message;
};

TEST(Config, RejectsBadInputNamingFileAndKey) {
  const std::vector<BadCase> tiny_cases = {
      {"unknown layer type",
       [](json& j) { j["layer_types"][2] = "dense_attention"; },
       {"bad.json", "layer_types[2]", "dense_attention"}},
      {"unknown mlp type",
       [](json& j) { j["mlp_layer_types"][0] = "dense"; },
       {"bad.json", "mlp_layer_types[0]"}},
      {"layer_types length",
       [](json& j) { j["layer_types"].erase(0); },
       {"bad.json", "layer_types has 4 entries", "num_hidden_layers is 5"}},
      {"mlp_layer_types length",
       [](json& j) { j["mlp_layer_types"].push_back("moe"); },
       {"bad.json", "mlp_layer_types has 6 entries"}},
      {"heads not divisible",
       [](json& j) { j["o_groups"] = 3; },
       {"bad.json", "num_attention_heads 4", "o_groups 3"}},
      {"odd rope dim",
       [](json& j) {
         j["qk_rope_head_dim"] = 7;
         j.erase("partial_rotary_factor");
         j["rope_parameters"]["main"].erase("partial_rotary_factor");
         j["rope_parameters"]["compress"].erase("partial_rotary_factor");
       },
       {"bad.json", "rope dims", "7", "even"}},
      {"rope dim > head dim",
       [](json& j) {
         j["qk_rope_head_dim"] = 64;
         j.erase("partial_rotary_factor");
         j["rope_parameters"]["main"].erase("partial_rotary_factor");
         j["rope_parameters"]["compress"].erase("partial_rotary_factor");
       },
       {"bad.json", "rope dims 64 exceed head_dim 32"}},
      {"rope dim disagrees with factor",
       [](json& j) { j["qk_rope_head_dim"] = 16; },
       {"bad.json", "qk_rope_head_dim 16", "partial_rotary_factor"}},
      {"topk > experts",
       [](json& j) { j["num_experts_per_tok"] = 9; },
       {"bad.json", "num_experts_per_tok 9", "n_routed_experts 8"}},
      {"missing key", [](json& j) { j.erase("hidden_size"); }, {"bad.json", "hidden_size"}},
      {"wrong type", [](json& j) { j["vocab_size"] = "big"; }, {"bad.json", "vocab_size", "integer"}},
      {"unknown rope type",
       [](json& j) { j["rope_parameters"]["compress"]["rope_type"] = "ntk"; },
       {"bad.json", "compress", "ntk"}},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 4; }, {"bad.json", "num_key_value_heads"}},
      {"no dialect", [](json& j) { j.erase("layer_types"); }, {"bad.json", "layer_types", "compress_ratios"}},
      {"model type", [](json& j) { j["model_type"] = "deepseek_v3"; }, {"bad.json", "deepseek_v3"}},
  };
  for (const auto& bc : tiny_cases) {
    SCOPED_TRACE(bc.what);
    json j = tiny_json();
    bc.mutate(j);
    expect_error([&] { parse_model_config(j, "bad.json"); }, bc.message);
  }
  const std::vector<BadCase> official_cases = {
      {"ratios length",
       [](json& j) {
         j["compress_ratios"] = {0, 4, 128};
       },
       {"bad.json", "compress_ratios has 3"}},
      {"negative ratio", [](json& j) { j["compress_ratios"][1] = -4; }, {"bad.json", "compress_ratios[1]"}},
      {"hash layers", [](json& j) { j["num_hash_layers"] = 9; }, {"bad.json", "num_hash_layers 9"}},
      {"missing index_topk with CSA", [](json& j) { j.erase("index_topk"); }, {"bad.json", "index_topk"}},
      {"yarn factor missing",
       [](json& j) { j["rope_scaling"].erase("factor"); },
       {"bad.json", "rope_scaling", "factor"}},
  };
  for (const auto& bc : official_cases) {
    SCOPED_TRACE(bc.what);
    json j = bench_json("flash-l4.json");
    bc.mutate(j);
    expect_error([&] { parse_model_config(j, "bad.json"); }, bc.message);
  }
  expect_error([] { load_model_config("/nonexistent/config.json"); }, {"/nonexistent/config.json"});
}
