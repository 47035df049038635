// save_state_dict / load_state_dict round trips: official <-> transformers naming, f32 and bf16, sharded,
// MTP included; load errors for missing, unexpected and mis-shaped tensors; the `trex ckpt` CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "ckpt/safetensors.h"
#include "ckpt_test_util.h"
#include "model/dsv4/checkpoint.h"

using namespace trex;
using namespace trex::dsv4;
using trex::test::expect_error;
using trex::test::ScratchDir;

namespace {

ModelConfig tiny_with_mtp() {
  ModelConfig c = load_model_config(test::fixture_dir() / "config.json");
  c.n_mtp = 1;
  return c;
}

StateDict random_state(const ModelConfig& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.1f);
  StateDict sd;
  for (const auto& e : expected_tensors(cfg)) {
    HostTensor t(e.dtype, e.shape);
    if (e.dtype == DType::I64) {
      for (int64_t i = 0; i < t.numel(); ++i)
        t.view.as<int64_t>()[i] = int64_t(rng() % uint32_t(cfg.n_routed_experts));
    } else {
      for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = normal(rng);
    }
    sd.emplace(e.name, std::move(t));
  }
  return sd;
}

void expect_equal_states(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [n, t] : a) {
    SCOPED_TRACE(n);
    ASSERT_TRUE(b.count(n));
    const HostTensor& u = b.at(n);
    ASSERT_EQ(t.shape(), u.shape());
    ASSERT_EQ(t.view.dtype, u.view.dtype);
    EXPECT_EQ(std::memcmp(t.view.data, u.view.data, t.view.nbytes()), 0);
  }
}

// Copy of the fixture's model.safetensors with edits: drop keys, add or replace tensors.
void write_edited_fixture(const fs::path& dir, const std::vector<std::string>& drop,
                          std::vector<ckpt::TensorToWrite> add) {
  ckpt::SafetensorsReader r(test::fixture_dir() / "model.safetensors");
  std::vector<ckpt::TensorToWrite> ts;
  for (const auto& n : r.names()) {
    if (std::find(drop.begin(), drop.end(), n) != drop.end()) continue;
    TensorView v = r.view(n);
    ts.push_back({n, v.dtype, v.shape, v.data, {}});
  }
  for (auto& t : add) ts.push_back(std::move(t));
  ckpt::write_safetensors(dir / "model.safetensors", ts);
  fs::copy_file(test::fixture_dir() / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
}

}  // namespace

TEST(Convert, OfficialTransformersOfficialIsLosslessF32WithMtpAndShards) {
  ModelConfig cfg = tiny_with_mtp();
  StateDict original = random_state(cfg, 42);
  ScratchDir a("a"), b("b"), c("c");
  save_state_dict(a.path(), original, cfg, Dialect::Official, DType::F32, 1 << 20);
  StateDict from_a = load_state_dict(a.path(), cfg);
  expect_equal_states(original, from_a);

  save_state_dict(b.path(), from_a, cfg, Dialect::Transformers, DType::F32, 1 << 20);
  ckpt::SafetensorsReader rb(b.path());
  EXPECT_TRUE(rb.sharded());
  EXPECT_TRUE(rb.contains("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(rb.entry("model.layers.0.mlp.experts.gate_up_proj").shape, (Shape{8, 64, 64}));
  EXPECT_EQ(rb.entry("model.layers.0.mlp.experts.down_proj").shape, (Shape{8, 64, 32}));
  EXPECT_TRUE(rb.contains("mtp.0.ffn.experts.7.w2.weight"));  // MTP stays official
  EXPECT_FALSE(rb.contains("layers.0.attn_norm.weight"));
  ModelConfig cfg_b = load_model_config(b.path());
  EXPECT_EQ(cfg_b.source_dialect, "transformers");
  EXPECT_EQ(cfg_b.n_mtp, 1);
  StateDict from_b = load_state_dict(b.path(), cfg_b);
  expect_equal_states(original, from_b);

  save_state_dict(c.path(), from_b, cfg_b, Dialect::Official, DType::F32, 1 << 30);
  EXPECT_EQ(load_model_config(c.path()).source_dialect, "official");
  expect_equal_states(original, load_state_dict(c.path(), load_model_config(c.path())));
}

TEST(Convert, Bf16ExportRoundsOnceThenIsLossless) {
  ModelConfig cfg = tiny_with_mtp();
  StateDict original = random_state(cfg, 7);
  ScratchDir a("a"), b("b");
  save_state_dict(a.path(), original, cfg, Dialect::Transformers, DType::BF16, 1 << 30);
  ckpt::SafetensorsReader ra(a.path());
  EXPECT_EQ(ra.entry("model.layers.0.self_attn.q_a_proj.weight").dtype, DType::BF16);
  EXPECT_EQ(ra.entry("model.layers.0.attn_hc.fn").dtype, DType::F32);  // mHC stays fp32
  EXPECT_EQ(ra.entry("model.layers.0.self_attn.sinks").dtype, DType::F32);
  EXPECT_EQ(ra.entry("model.layers.2.mlp.gate.e_score_correction_bias").dtype, DType::F32);
  EXPECT_EQ(ra.entry("model.layers.0.mlp.gate.tid2eid").dtype, DType::I64);
  EXPECT_EQ(read_json_file(a / "config.json")["torch_dtype"], "bfloat16");

  StateDict loaded = load_state_dict(a.path(), cfg);
  for (const auto& [n, t] : original) {
    if (t.view.dtype != DType::F32) continue;
    const float* x = t.f32();
    const float* y = loaded.at(n).f32();
    const bool fp32 = keeps_fp32(n);
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_EQ(y[i], fp32 ? x[i] : bf16_to_f32(f32_to_bf16(x[i]))) << n << " element " << i;
  }
  save_state_dict(b.path(), loaded, cfg, Dialect::Official, DType::BF16, 1 << 30);
  expect_equal_states(loaded, load_state_dict(b.path(), cfg));
}

TEST(Convert, FixtureToOfficialAndBackReproducesTheFixtureBytes) {
  ModelConfig cfg = load_model_config(test::fixture_dir() / "config.json");
  StateDict sd = load_state_dict(test::fixture_dir(), cfg);
  ScratchDir a("a"), b("b");
  save_state_dict(a.path(), sd, cfg, Dialect::Official, DType::F32, 1 << 30);
  save_state_dict(b.path(), load_state_dict(a.path(), cfg), cfg, Dialect::Transformers, DType::F32, 1 << 30);
  ckpt::SafetensorsReader fixture(test::fixture_dir() / "model.safetensors"), back(b.path());
  EXPECT_EQ(fixture.names(), back.names());
  for (const auto& n : fixture.names()) {
    TensorView u = fixture.view(n), v = back.view(n);
    ASSERT_EQ(u.shape, v.shape) << n;
    ASSERT_EQ(u.dtype, v.dtype) << n;
    EXPECT_EQ(std::memcmp(u.data, v.data, u.nbytes()), 0) << n;
  }
}

TEST(Convert, LoadErrorsNameTheTensor) {
  ModelConfig cfg = load_model_config(test::fixture_dir() / "config.json");
  {
    ScratchDir d("missing");
    write_edited_fixture(d.path(), {"model.layers.2.self_attn.compressor.kv_norm.weight"}, {});
    expect_error([&] { load_state_dict(d.path(), cfg); },
                 {d.path().string(), "missing", "layers.2.attn.compressor.norm.weight [32]"});
  }
  {
    ScratchDir d("shape");
    std::vector<float> small(320 * 32, 0.f);
    write_edited_fixture(d.path(), {"lm_head.weight"},
                         {{"lm_head.weight", DType::F32, {320, 32}, small.data(), {}}});
    expect_error([&] { load_state_dict(d.path(), cfg); },
                 {"'head.weight'", "lm_head.weight", "expected shape [320, 64]", "found [320, 32]"});
  }
  {
    ScratchDir d("unexpected");
    std::vector<float> bias(8, 0.f);
    write_edited_fixture(
        d.path(), {},
        {{"model.layers.0.mlp.gate.e_score_correction_bias", DType::F32, {8}, bias.data(), {}},
         {"model.layers.0.self_attn.mystery.weight", DType::F32, {8}, bias.data(), {}}});
    expect_error([&] { load_state_dict(d.path(), cfg); },
                 {"2 tensor(s) the config does not account for", "layers.0.ffn.gate.bias",
                  "model.layers.0.self_attn.mystery.weight"});
    LoadOptions lenient;
    lenient.allow_unexpected = true;
    StateDict sd = load_state_dict(d.path(), cfg, lenient);
    EXPECT_FALSE(sd.count("layers.0.ffn.gate.bias"));
    EXPECT_EQ(sd.size(), expected_tensors(cfg).size());
  }
  {
    ScratchDir d("tid");
    std::vector<int64_t> tid(320 * 2, 1);
    tid[5] = 8;  // only 8 experts: 0..7
    write_edited_fixture(d.path(), {"model.layers.1.mlp.gate.tid2eid"},
                         {{"model.layers.1.mlp.gate.tid2eid", DType::I64, {320, 2}, tid.data(), {}}});
    expect_error([&] { load_state_dict(d.path(), cfg); },
                 {"layers.1.ffn.gate.tid2eid", "entry 5", "expert 8"});
  }
  {
    ScratchDir d("export");
    StateDict sd = random_state(cfg, 1);
    sd.erase("norm.weight");
    expect_error([&] { save_state_dict(d.path(), sd, cfg, Dialect::Official); }, {"norm.weight"});
  }
}

TEST(Convert, CliConvertAndInspect) {
  const fs::path trex_bin = TREX_BINARY;
  if (!fs::exists(trex_bin)) GTEST_SKIP() << "trex binary not built: " << trex_bin;
  ScratchDir out("cli");
  const fs::path official = out / "official", back = out / "back";
  std::string cmd = fmt::format(
      "'{}' ckpt convert --in '{}' --out '{}' --naming official --dtype f32 > '{}' 2>&1", trex_bin.string(),
      test::fixture_dir().string(), official.string(), (out / "log1").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text_file(out / "log1");
  cmd = fmt::format("'{}' ckpt convert --in '{}' --out '{}' --naming transformers --dtype f32 > '{}' 2>&1",
                    trex_bin.string(), official.string(), back.string(), (out / "log2").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_text_file(out / "log2");
  ckpt::SafetensorsReader fixture(test::fixture_dir() / "model.safetensors"), again(back);
  ASSERT_EQ(fixture.names(), again.names());
  for (const auto& n : fixture.names())
    EXPECT_EQ(std::memcmp(fixture.view(n).data, again.view(n).data, fixture.view(n).nbytes()), 0) << n;

  cmd = fmt::format("'{}' ckpt inspect '{}' > '{}' 2>&1", trex_bin.string(), official.string(),
                    (out / "log3").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string text = read_text_file(out / "log3");
  EXPECT_NE(text.find("official naming"), std::string::npos) << text;
  EXPECT_NE(text.find("layers.1.attn.indexer.wq_b.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("official dialect"), std::string::npos) << text;

  cmd = fmt::format("'{}' ckpt convert --in /nonexistent --out '{}' > '{}' 2>&1", trex_bin.string(),
                    (out / "x").string(), (out / "log4").string());
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(read_text_file(out / "log4").find("/nonexistent"), std::string::npos);
}
