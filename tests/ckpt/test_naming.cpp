// official <-> transformers names: the design §3.6 table, the fixture's keys, a full official key set
// with MTP and FP8 scales, and the accepted alternative spellings.
#include <gtest/gtest.h>

#include <set>

#include "ckpt/safetensors.h"
#include "ckpt_test_util.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/naming.h"

using namespace trex;
using namespace trex::dsv4;
using trex::test::expect_error;

TEST(Naming, DesignTable) {
  const std::pair<const char*, const char*> table[] = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"head.weight", "lm_head.weight"},
      {"norm.weight", "model.norm.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_scale", "model.hc_head.hc_scale"},
      {"layers.12.attn_norm.weight", "model.layers.12.input_layernorm.weight"},
      {"layers.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"},
      {"layers.0.hc_attn_base", "model.layers.0.attn_hc.base"},
      {"layers.0.hc_ffn_scale", "model.layers.0.ffn_hc.scale"},
      {"layers.3.attn.attn_sink", "model.layers.3.self_attn.sinks"},
      {"layers.3.attn.wq_a.weight", "model.layers.3.self_attn.q_a_proj.weight"},
      {"layers.3.attn.wq_a.scale", "model.layers.3.self_attn.q_a_proj.weight_scale_inv"},
      {"layers.3.attn.q_norm.weight", "model.layers.3.self_attn.q_a_norm.weight"},
      {"layers.3.attn.wo_b.scale", "model.layers.3.self_attn.o_b_proj.weight_scale_inv"},
      {"layers.3.attn.compressor.ape", "model.layers.3.self_attn.compressor.position_bias"},
      {"layers.3.attn.compressor.norm.weight", "model.layers.3.self_attn.compressor.kv_norm.weight"},
      {"layers.3.attn.indexer.compressor.wgate.weight",
       "model.layers.3.self_attn.compressor.indexer.gate_proj.weight"},
      {"layers.3.attn.indexer.wq_b.scale",
       "model.layers.3.self_attn.compressor.indexer.q_b_proj.weight_scale_inv"},
      {"layers.3.attn.indexer.weights_proj.weight",
       "model.layers.3.self_attn.compressor.indexer.scorer.weights_proj.weight"},
      {"layers.3.ffn.gate.bias", "model.layers.3.mlp.gate.e_score_correction_bias"},
      {"layers.1.ffn.gate.tid2eid", "model.layers.1.mlp.gate.tid2eid"},
      {"layers.3.ffn.shared_experts.w3.weight", "model.layers.3.mlp.shared_experts.up_proj.weight"},
      {"layers.3.ffn.shared_experts.w2.scale",
       "model.layers.3.mlp.shared_experts.down_proj.weight_scale_inv"},
      {"mtp.0.e_proj.weight", "mtp.0.e_proj.weight"},  // MTP keeps its official name
  };
  for (const auto& [official, hf] : table) {
    EXPECT_EQ(official_to_transformers(official), hf);
    EXPECT_EQ(transformers_to_official(hf), official);
  }
}

TEST(Naming, AlternativeSpellingsAreAccepted) {
  EXPECT_EQ(transformers_to_official("model.layers.4.self_attn.q_norm.weight"),
            "layers.4.attn.q_norm.weight");
  EXPECT_EQ(transformers_to_official("model.layers.1.self_attn.compressor.indexer.weights_proj.weight"),
            "layers.1.attn.indexer.weights_proj.weight");
  EXPECT_EQ(transformers_to_official("model.layers.5.mlp.experts.17.up_proj.weight"),
            "layers.5.ffn.experts.17.w3.weight");
  EXPECT_EQ(transformers_to_official("model.layers.5.mlp.experts.17.down_proj.weight_scale_inv"),
            "layers.5.ffn.experts.17.w2.scale");
}

TEST(Naming, EveryFixtureKeyRoundTrips) {
  ckpt::SafetensorsReader r(test::fixture_dir() / "model.safetensors");
  std::set<std::string> officials;
  int stacked = 0;
  for (const auto& key : r.names()) {
    int64_t layer = -1;
    bool gate_up = false;
    if (parse_transformers_stacked_key(key, &layer, &gate_up)) {
      EXPECT_EQ(key, gate_up ? transformers_gate_up_key(layer) : transformers_down_key(layer));
      ++stacked;
      continue;
    }
    std::string official = transformers_to_official(key);
    EXPECT_EQ(official.rfind("model.", 0), std::string::npos) << official;
    EXPECT_TRUE(officials.insert(official).second) << "two keys map to " << official;
    EXPECT_EQ(official_to_transformers(official), key);
  }
  EXPECT_EQ(stacked, 10);  // gate_up + down in each of 5 layers
}

TEST(Naming, FullOfficialKeySetWithMtpAndScalesRoundTrips) {
  ModelConfig cfg = load_model_config(test::fixture_dir() / "config.json");
  cfg.n_mtp = 1;
  std::vector<std::string> keys;
  for (const auto& e : expected_tensors(cfg)) {
    keys.push_back(e.name);
    // Every FP8 linear of the released checkpoints carries a .scale beside its weight.
    for (const char* lin : {".wq_a.weight", ".wq_b.weight", ".wkv.weight", ".wo_a.weight", ".wo_b.weight",
                            "e_proj.weight", "shared_experts.w1.weight", ".w2.weight"})
      if (e.name.size() > std::string(lin).size() &&
          e.name.compare(e.name.size() - std::string(lin).size(), std::string::npos, lin) == 0)
        keys.push_back(e.name.substr(0, e.name.size() - 7) + ".scale");
  }
  std::set<std::string> hf_seen;
  int mtp = 0, experts = 0;
  for (const auto& k : keys) {
    SCOPED_TRACE(k);
    ExpertKey ek;
    if (parse_official_expert_key(k, &ek) && ek.block.rfind("layers.", 0) == 0) {
      EXPECT_EQ(official_expert_key(ek.block, ek.expert, ek.w, ek.scale), k);
      expect_error([&] { official_to_transformers(k); }, {k, "stacked"});
      ++experts;
      continue;
    }
    std::string hf = official_to_transformers(k);
    EXPECT_TRUE(hf_seen.insert(hf).second) << "collision at " << hf;
    EXPECT_EQ(transformers_to_official(hf), k);
    if (k.rfind("mtp.0.", 0) == 0) {
      EXPECT_EQ(hf, k);
      ++mtp;
    } else {
      EXPECT_TRUE(hf.rfind("model.", 0) == 0 || hf == "lm_head.weight") << hf;
    }
  }
  EXPECT_GT(mtp, 30);
  EXPECT_GT(experts, 5 * 8 * 3);
}

TEST(Naming, UnknownKeysAreErrorsNamingTheKey) {
  expect_error([] { transformers_to_official("model.layers.0.self_attn.bogus.weight"); },
               {"model.layers.0.self_attn.bogus.weight"});
  expect_error([] { official_to_transformers("layers.0.attn.bogus.weight"); },
               {"layers.0.attn.bogus.weight"});
  expect_error([] { official_to_transformers("layers.x.attn_norm.weight"); }, {"layers.x.attn_norm.weight"});
  expect_error([] { transformers_to_official("model.layers.2.mlp.experts.gate_up_proj"); },
               {"gate_up_proj", "stacked"});
}

TEST(Naming, DetectNaming) {
  EXPECT_EQ(detect_naming({"embed.weight", "layers.0.attn_norm.weight"}), Naming::Official);
  EXPECT_EQ(detect_naming({"lm_head.weight"}), Naming::Transformers);
  EXPECT_EQ(detect_naming({"mtp.0.norm.weight", "model.norm.weight"}), Naming::Transformers);
}
