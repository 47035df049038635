// The parameter table (model/dsv4/param_table.h) against what exists outside it: the tensors the golden fixtures'
// checkpoints store (written by transformers from its own model definition), and the partition rules.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/files.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/param_table.h"

using namespace trex;
using namespace trex::dsv4;

namespace {

fs::path fixture(const std::string& name) {
  if (name == "tiny") return shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  return source_dir() / "tests" / "fixtures" / "deepseek-v4" / name;
}

class ParamTableFixture : public ::testing::TestWithParam<const char*> {};

// Every tensor of the fixture's checkpoint is in the table with the same shape, and the table has nothing more.
TEST_P(ParamTableFixture, NamesAndShapesAreTheCheckpointsTensors) {
  const fs::path dir = fixture(GetParam());
  if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << "fixture not found at " << dir;
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const CheckpointReader reader(dir / "model.safetensors");
  std::map<std::string, Shape> stored;
  for (const std::string& n : reader.official_names()) stored[n] = reader.shape(n);
  ASSERT_FALSE(stored.empty());
  std::set<std::string> seen;
  for (const ParamSpec& s : param_table(cfg)) {
    SCOPED_TRACE(s.name);
    EXPECT_TRUE(seen.insert(s.name).second) << "declared twice";
    auto it = stored.find(s.name);
    ASSERT_NE(it, stored.end()) << "the table has a tensor the checkpoint lacks";
    EXPECT_EQ(shape_str(it->second), shape_str(s.shape));
  }
  for (const auto& [n, shape] : stored) EXPECT_TRUE(seen.count(n)) << n << " is stored but not in the table";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParamTableFixture, ::testing::Values("tiny", "v4-tiny-b", "v4-tiny-c"));

// Owner, dtype and init follow the names the official checkpoints use.
TEST(ParamTable, OwnersDtypesAndInitsAreConsistent) {
  const ModelConfig cfg = load_model_config(fixture("v4-tiny-b") / "config.json");
  ModelConfig with_mtp = cfg;
  with_mtp.n_mtp = 1;
  int64_t experts = 0, hash = 0, bias = 0;
  for (const ParamSpec& s : param_table(with_mtp)) {
    SCOPED_TRACE(s.name);
    if (s.kind == ParamKind::HashTable) {
      ++hash;
      EXPECT_EQ(s.dtype, DType::I64);
      EXPECT_EQ(cfg.mlp_types[size_t(s.layer)], MlpType::HashMoE);
      continue;
    }
    EXPECT_EQ(s.dtype == DType::F32, keeps_fp32(s.name));
    if (s.kind == ParamKind::RouterBias) {
      ++bias;
      EXPECT_EQ(s.init, ParamInit::Zero);
    }
    if (s.name.find(".experts.") != std::string::npos) {
      ++experts;
      EXPECT_NE(s.name.find(".experts." + std::to_string(s.expert) + "."), std::string::npos);
    } else {
      EXPECT_EQ(s.expert, -1);
    }
    if (s.name.ends_with("norm.weight")) {
      EXPECT_EQ(s.init, ParamInit::One);
    }
    if (s.name.ends_with("attn_sink") || s.name.ends_with(".ape")) {
      EXPECT_EQ(s.init, ParamInit::Zero);
    }
    if (s.name.rfind("layers.", 0) == 0) {
      EXPECT_EQ(s.part, ParamPart::Layer);
      EXPECT_EQ(s.name.rfind("layers." + std::to_string(s.layer) + ".", 0), 0u);
    }
    if (s.name.rfind("mtp.", 0) == 0) {
      EXPECT_EQ(s.part, ParamPart::Mtp);
    }
    EXPECT_EQ(s.lm_grad, s.name.find(".indexer.") == std::string::npos && s.kind == ParamKind::Weight);
  }
  EXPECT_EQ(experts, (cfg.n_layers + 1) * cfg.n_routed_experts * 3);
  EXPECT_EQ(hash, cfg.n_hash_layers());
  EXPECT_EQ(bias, cfg.n_layers + 1 - cfg.n_hash_layers());
}

// Two pipeline stages x two expert-parallel ranks hold every tensor exactly once, except embed.weight, which the
// head stage also holds for the MTP input.
TEST(ParamTable, PartitionsCoverTheTableOnce) {
  ModelConfig cfg = load_model_config(fixture("v4-tiny-b") / "config.json");
  cfg.n_mtp = 1;
  const int64_t L = cfg.n_layers, E = cfg.n_routed_experts;
  ASSERT_GE(L, 2);
  ASSERT_EQ(E % 2, 0);
  std::vector<ModelPartition> parts;
  for (int stage = 0; stage < 2; ++stage)
    for (int ep = 0; ep < 2; ++ep) {
      ModelPartition p;
      p.layer_begin = stage == 0 ? 0 : L / 2, p.layer_end = stage == 0 ? L / 2 : L;
      p.embed = stage == 0, p.head = stage == 1;
      p.expert_begin = ep * E / 2, p.expert_end = (ep + 1) * E / 2;
      parts.push_back(p.resolved(cfg));
    }
  for (const ParamSpec& s : param_table(cfg)) {
    int holders = 0;
    for (const ModelPartition& p : parts) holders += partition_holds(p, s, true);
    // Dense tensors are on both EP ranks of their stage; routed experts on one.
    const int want = (s.expert >= 0 ? 1 : 2) * (s.name == "embed.weight" ? 2 : 1);
    EXPECT_EQ(holders, want) << s.name;
  }
}

}  // namespace
