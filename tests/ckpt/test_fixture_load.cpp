// The tiny golden fixture (transformers naming, F32 + I64) read raw and through load_state_dict.
#include <gtest/gtest.h>

#include <cstring>

#include "ckpt/safetensors.h"
#include "ckpt_test_util.h"
#include "model/dsv4/checkpoint.h"

using namespace trex;
using namespace trex::dsv4;

TEST(FixtureLoad, RawShapesMatchFixtureJson) {
  ckpt::SafetensorsReader r(test::fixture_dir() / "model.safetensors");
  json fx = read_json_file(test::fixture_dir() / "fixture.json");
  const json& params = fx["params"];
  EXPECT_EQ(r.size(), params.size());
  for (auto it = params.begin(); it != params.end(); ++it) {
    ASSERT_TRUE(r.contains(it.key())) << it.key();
    EXPECT_EQ(r.entry(it.key()).shape, it->get<Shape>()) << it.key();
  }
  EXPECT_EQ(r.entry("model.layers.0.mlp.gate.tid2eid").dtype, DType::I64);
  EXPECT_EQ(r.entry("lm_head.weight").dtype, DType::F32);
  EXPECT_EQ(r.files().front()->metadata().value("format", ""), "pt");
  // The directory form finds model.safetensors itself.
  ckpt::SafetensorsReader dir(test::fixture_dir());
  EXPECT_EQ(dir.size(), r.size());
}

TEST(FixtureLoad, StateDictIsOfficialNamedAndMatchesStoredData) {
  ModelConfig cfg = load_model_config(test::fixture_dir() / "config.json");
  StateDict sd = load_state_dict(test::fixture_dir(), cfg);
  EXPECT_EQ(sd.size(), expected_tensors(cfg).size());
  ckpt::SafetensorsReader raw(test::fixture_dir() / "model.safetensors");

  auto same = [&](const std::string& official, const std::string& stored) {
    const HostTensor& t = sd.at(official);
    TensorView v = raw.view(stored);
    ASSERT_EQ(t.shape(), v.shape) << official;
    EXPECT_EQ(std::memcmp(t.view.data, v.data, v.nbytes()), 0) << official;
  };
  same("embed.weight", "model.embed_tokens.weight");
  same("head.weight", "lm_head.weight");
  same("hc_head_fn", "model.hc_head.hc_fn");
  same("layers.1.attn.q_norm.weight", "model.layers.1.self_attn.q_a_norm.weight");
  same("layers.1.attn.indexer.weights_proj.weight",
       "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight");
  same("layers.2.attn.compressor.ape", "model.layers.2.self_attn.compressor.position_bias");
  same("layers.3.ffn.gate.bias", "model.layers.3.mlp.gate.e_score_correction_bias");
  same("layers.4.hc_ffn_fn", "model.layers.4.ffn_hc.fn");

  // tid2eid stays an integer table.
  const HostTensor& tid = sd.at("layers.0.ffn.gate.tid2eid");
  EXPECT_EQ(tid.view.dtype, DType::I64);
  EXPECT_EQ(std::memcmp(tid.view.data, raw.view("model.layers.0.mlp.gate.tid2eid").data, 320 * 2 * 8), 0);

  // Routed experts are unstacked: gate rows first, then up rows; down_proj per expert.
  const int64_t E = 8, f = 32, d = 64;
  const float* gu = raw.view("model.layers.3.mlp.experts.gate_up_proj").as<const float>();
  const float* dn = raw.view("model.layers.3.mlp.experts.down_proj").as<const float>();
  for (int64_t e = 0; e < E; ++e) {
    const float* w1 = sd.at(official_expert_key("layers.3", e, 1)).f32();
    const float* w3 = sd.at(official_expert_key("layers.3", e, 3)).f32();
    const float* w2 = sd.at(official_expert_key("layers.3", e, 2)).f32();
    for (int64_t i = 0; i < f; ++i)
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(w1[i * d + j], gu[(e * 2 * f + i) * d + j]);
        ASSERT_EQ(w3[i * d + j], gu[(e * 2 * f + f + i) * d + j]);
      }
    for (int64_t i = 0; i < d * f; ++i) ASSERT_EQ(w2[i], dn[e * d * f + i]);
  }
}

TEST(FixtureLoad, FilterLoadsOnlyTheRequestedTensors) {
  ModelConfig cfg = load_model_config(test::fixture_dir() / "config.json");
  LoadOptions opts;
  opts.filter = [](const std::string& n) { return n.rfind("layers.2.", 0) == 0; };
  StateDict sd = load_state_dict(test::fixture_dir(), cfg, opts);
  EXPECT_GT(sd.size(), 0u);
  for (const auto& [n, t] : sd) EXPECT_EQ(n.rfind("layers.2.", 0), 0u) << n;
  EXPECT_TRUE(sd.count("layers.2.ffn.experts.7.w2.weight"));
}

// Every golden fixture (the shared tiny one and the repo's extra ones: other head counts, hc_mult 3,
// rope factor 1/6, other HCA ratios) parses, and loads with every shape matching its fixture.json.
TEST(FixtureLoad, EveryFixtureLoadsWithConfigShapes) {
  std::vector<fs::path> dirs = {test::fixture_dir()};
  const fs::path extra = source_dir() / "tests" / "fixtures" / "deepseek-v4";
  if (fs::exists(extra))
    for (const auto& de : fs::directory_iterator(extra))
      if (fs::exists(de.path() / "config.json")) dirs.push_back(de.path());
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    ModelConfig cfg = load_model_config(dir / "config.json");
    StateDict sd = load_state_dict(dir, cfg);
    json fx = read_json_file(dir / "fixture.json");
    for (auto it = fx["params"].begin(); it != fx["params"].end(); ++it) {
      int64_t layer = 0;
      bool gate_up = false;
      if (parse_transformers_stacked_key(it.key(), &layer, &gate_up)) {
        Shape s = it->get<Shape>();  // [E, 2f, d] or [E, d, f]
        EXPECT_EQ(s[0], cfg.n_routed_experts);
        Shape per = gate_up ? Shape{s[1] / 2, s[2]} : Shape{s[1], s[2]};
        EXPECT_EQ(
            sd.at(official_expert_key("layers." + std::to_string(layer), s[0] - 1, gate_up ? 3 : 2)).shape(),
            per);
        continue;
      }
      EXPECT_EQ(sd.at(transformers_to_official(it.key())).shape(), it->get<Shape>()) << it.key();
    }
  }
}
