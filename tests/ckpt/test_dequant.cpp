// FP8 128x128 block and MXFP4 (int8-packed, 1x32 scales) de-quantisation against hand-computed values,
// directly and through CheckpointReader in both namings.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "ckpt/safetensors.h"
#include "ckpt_test_util.h"
#include "model/dsv4/checkpoint.h"

using namespace trex;
using namespace trex::dsv4;
using trex::test::expect_error;
using trex::test::ScratchDir;

namespace {

// W [130, 131] FP8: two block rows and two block columns, the second of each partial.
struct Fp8Case {
  int64_t rows = 130, cols = 131;
  std::vector<uint8_t> w = std::vector<uint8_t>(size_t(130 * 131), 0);
  std::vector<uint8_t> s = {129, 130, 125, 120};  // 4, 8, 0.25, 2^-7
  Fp8Case() {
    w[0] = 0x38;                // 1.0 in block (0,0)        -> 4
    w[127 * 131 + 127] = 0x40;  // 2.0 at the block's corner -> 8
    w[128 * 131 + 0] = 0xC0;    // -2.0 in block (1,0)       -> -0.5
    w[0 * 131 + 128] = 0x30;    // 0.5 in block (0,1)        -> 4
    w[129 * 131 + 130] = 0x7E;  // 448 in block (1,1)        -> 3.5
    w[5 * 131 + 7] = 0x01;      // 2^-9 (subnormal) x 4      -> 2^-7
  }
};

// P [2, 32] int8 holding W [2, 64] as e2m1 nibbles; S [2, 2] E8M0.
struct Fp4Case {
  std::vector<uint8_t> p = std::vector<uint8_t>(64, 0);
  std::vector<uint8_t> s = {128, 126, 131, 127};  // row 0: 2, 0.5; row 1: 16, 1
  Fp4Case() {
    p[0] = 0x2F;        // W[0,0] = -6 * 2 = -12, W[0,1] = 1 * 2 = 2
    p[16] = 0x91;       // W[0,32] = 0.5 * 0.5 = 0.25, W[0,33] = -0.5 * 0.5 = -0.25
    p[32 + 15] = 0x53;  // W[1,30] = 1.5 * 16 = 24, W[1,31] = 3 * 16 = 48
    p[32 + 31] = 0x7C;  // W[1,62] = -2 * 1 = -2, W[1,63] = 6 * 1 = 6
  }
  static void check(const float* w) {
    for (int64_t i = 0; i < 2 * 64; ++i) {
      float want = 0.f;
      switch (i) {
        case 0:
          want = -12.f;
          break;
        case 1:
          want = 2.f;
          break;
        case 32:
          want = 0.25f;
          break;
        case 33:
          want = -0.25f;
          break;
        case 64 + 30:
          want = 24.f;
          break;
        case 64 + 31:
          want = 48.f;
          break;
        case 64 + 62:
          want = -2.f;
          break;
        case 64 + 63:
          want = 6.f;
          break;
      }
      EXPECT_EQ(w[i], want) << "element " << i;
    }
  }
};

void check_fp8(const float* o) {
  const int64_t C = 131;
  for (int64_t i = 0; i < 130 * C; ++i) {
    float want = 0.f;
    if (i == 0) want = 4.f;
    if (i == 127 * C + 127) want = 8.f;
    if (i == 128 * C) want = -0.5f;
    if (i == 128) want = 4.f;
    if (i == 129 * C + 130) want = 3.5f;
    if (i == 5 * C + 7) want = 1.f / 128.f;
    ASSERT_EQ(o[i], want) << "row " << i / C << " col " << i % C;
  }
}

}  // namespace

TEST(Dequant, Fp8BlockE8M0) {
  Fp8Case c;
  std::vector<float> out(size_t(c.rows * c.cols));
  dequant_fp8_block(c.w.data(), c.rows, c.cols, c.s.data(), DType::F8_E8M0, 128, out.data());
  check_fp8(out.data());
}

TEST(Dequant, Fp8BlockF32ScalesOfBaseCheckpoints) {
  Fp8Case c;
  std::vector<float> s = {3.f, 1.f, 1.f, 1.f};
  std::vector<float> out(size_t(c.rows * c.cols));
  dequant_fp8_block(c.w.data(), c.rows, c.cols, s.data(), DType::F32, 128, out.data());
  EXPECT_EQ(out[0], 3.f);                // 1.0 x 3 (not a power of two)
  EXPECT_EQ(out[128 * 131], -2.f);       // block (1,0) scale 1
  EXPECT_EQ(out[127 * 131 + 127], 6.f);  // 2.0 x 3
}

TEST(Dequant, Fp4PackedLowNibbleIsEvenElement) {
  Fp4Case c;
  std::vector<float> out(128);
  dequant_fp4_packed(c.p.data(), 2, 64, c.s.data(), DType::F8_E8M0, out.data());
  Fp4Case::check(out.data());
}

TEST(Dequant, ThroughCheckpointReaderOfficialNaming) {
  ScratchDir dir("official");
  Fp8Case a;
  Fp4Case b;
  const uint16_t bf16_half = f32_to_bf16(0.5f);
  ckpt::write_safetensors(dir / "model.safetensors",
                          {{"layers.0.attn.wq_a.weight", DType::F8_E4M3, {130, 131}, a.w.data(), {}},
                           {"layers.0.attn.wq_a.scale", DType::F8_E8M0, {2, 2}, a.s.data(), {}},
                           {"layers.0.ffn.experts.3.w2.weight", DType::I8, {2, 32}, b.p.data(), {}},
                           {"layers.0.ffn.experts.3.w2.scale", DType::F8_E8M0, {2, 2}, b.s.data(), {}},
                           {"layers.0.attn_norm.weight", DType::BF16, {1}, &bf16_half, {}}});
  CheckpointReader r(dir.path());
  EXPECT_EQ(r.naming(), Naming::Official);
  EXPECT_EQ(r.official_names(),
            (std::vector<std::string>{"layers.0.attn.wq_a.weight", "layers.0.attn_norm.weight",
                                      "layers.0.ffn.experts.3.w2.weight"}));
  EXPECT_TRUE(r.unrecognised().empty());
  HostTensor w = r.load("layers.0.attn.wq_a.weight");
  EXPECT_EQ(w.shape(), (Shape{130, 131}));
  check_fp8(w.f32());
  HostTensor e = r.load("layers.0.ffn.experts.3.w2.weight");
  EXPECT_EQ(e.shape(), (Shape{2, 64}));  // logical shape: two elements per stored byte
  Fp4Case::check(e.f32());
  EXPECT_EQ(r.load("layers.0.attn_norm.weight").f32()[0], 0.5f);
}

TEST(Dequant, ThroughCheckpointReaderTransformersWeightScaleInv) {
  ScratchDir dir("hf");
  Fp8Case a;
  ckpt::write_safetensors(
      dir / "model.safetensors",
      {{"model.layers.2.self_attn.q_a_proj.weight", DType::F8_E4M3, {130, 131}, a.w.data(), {}},
       {"model.layers.2.self_attn.q_a_proj.weight_scale_inv", DType::F8_E8M0, {2, 2}, a.s.data(), {}}});
  CheckpointReader r(dir.path());
  EXPECT_EQ(r.naming(), Naming::Transformers);
  check_fp8(r.load("layers.2.attn.wq_a.weight").f32());
}

TEST(Dequant, BlockSizeFromQuantizationConfig) {
  ScratchDir dir("block");
  // 4x4 weight with 2x2 blocks: scale [2, 2].
  std::vector<uint8_t> w(16, 0x38);               // all 1.0
  std::vector<uint8_t> s = {127, 128, 129, 130};  // 1, 2, 4, 8
  ckpt::write_safetensors(dir / "model.safetensors", {{"head.weight", DType::F8_E4M3, {4, 4}, w.data(), {}},
                                                      {"head.scale", DType::F8_E8M0, {2, 2}, s.data(), {}}});
  write_json_atomic(dir / "config.json", json{{"quantization_config", {{"weight_block_size", {2, 2}}}}});
  CheckpointReader r(dir.path());
  EXPECT_EQ(r.block_size(), 2);
  HostTensor t = r.load("head.weight");
  const float want[16] = {1, 1, 2, 2, 1, 1, 2, 2, 4, 4, 8, 8, 4, 4, 8, 8};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(t.f32()[i], want[i]) << i;
}

TEST(Dequant, QuantisationErrorsNameTheTensor) {
  ScratchDir dir("errs");
  Fp8Case a;
  ckpt::write_safetensors(dir / "noscale.safetensors",
                          {{"layers.0.attn.wkv.weight", DType::F8_E4M3, {130, 131}, a.w.data(), {}}});
  expect_error([&] { CheckpointReader r(dir / "noscale.safetensors"); },
               {"layers.0.attn.wkv.weight", "no scale", "layers.0.attn.wkv.scale"});
  ckpt::write_safetensors(dir / "badscale.safetensors",
                          {{"layers.0.attn.wkv.weight", DType::F8_E4M3, {130, 131}, a.w.data(), {}},
                           {"layers.0.attn.wkv.scale", DType::F8_E8M0, {1, 2}, a.s.data(), {}}});
  expect_error([&] { CheckpointReader r(dir / "badscale.safetensors"); },
               {"layers.0.attn.wkv.scale", "[1, 2]", "expected [2, 2]"});
  Fp4Case b;
  ckpt::write_safetensors(dir / "badfp4.safetensors",
                          {{"layers.0.ffn.experts.0.w1.weight", DType::I8, {2, 32}, b.p.data(), {}},
                           {"layers.0.ffn.experts.0.w1.scale", DType::F8_E8M0, {2, 1}, b.s.data(), {}}});
  expect_error([&] { CheckpointReader r(dir / "badfp4.safetensors"); },
               {"layers.0.ffn.experts.0.w1.scale", "expected [2, 2]"});
}

// A whole official-format checkpoint of the tiny config as the releases store it: FP8 linears with E8M0
// block scales, MXFP4 routed experts (int8-packed) with 1x32 E8M0 scales, everything else F32/BF16.
TEST(Dequant, LoadStateDictOfQuantisedOfficialCheckpoint) {
  ModelConfig cfg = load_model_config(test::fixture_dir() / "config.json");
  ScratchDir dir("quant");
  std::mt19937 rng(5);
  struct Stored {
    std::vector<uint8_t> bytes;
  };
  std::vector<std::unique_ptr<Stored>> keep;
  std::vector<ckpt::TensorToWrite> ts;
  std::map<std::string, std::vector<float>> want;
  auto bytes = [&](size_t n, auto gen) {
    keep.push_back(std::make_unique<Stored>());
    keep.back()->bytes.resize(n);
    for (auto& b : keep.back()->bytes) b = gen();
    return keep.back()->bytes.data();
  };
  auto fp8_code = [&] {
    uint8_t c = uint8_t(rng());
    return (c & 0x7f) == 0x7f ? uint8_t(0x38) : c;
  };  // no NaN
  auto e8m0 = [&] { return uint8_t(120 + rng() % 12); };
  int fp8 = 0, fp4 = 0;
  for (const auto& e : expected_tensors(cfg)) {
    const std::string& n = e.name;
    const bool expert = n.find(".ffn.experts.") != std::string::npos;
    const bool linear =
        n.find(".wq_a.") != std::string::npos || n.find(".wq_b.") != std::string::npos ||
        (n.find(".wkv.weight") != std::string::npos && n.find("compressor") == std::string::npos) ||
        n.find(".wo_") != std::string::npos || n.find("shared_experts") != std::string::npos;
    if (expert) {
      const int64_t rows = e.shape[0], cols = e.shape[1];
      const uint8_t* p = bytes(size_t(rows * cols / 2), [&] { return uint8_t(rng()); });
      const uint8_t* s = bytes(size_t(rows * cols / 32), e8m0);
      std::vector<float> w(size_t(rows * cols));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          uint8_t byte = p[i * cols / 2 + j / 2];
          w[size_t(i * cols + j)] = fp4_e2m1_to_f32(j % 2 ? byte >> 4 : byte & 15) *
                                    std::ldexp(1.f, int(s[i * cols / 32 + j / 32]) - 127);
        }
      want[n] = std::move(w);
      ts.push_back({n, DType::I8, {rows, cols / 2}, p, {}});
      ts.push_back({n.substr(0, n.size() - 7) + ".scale", DType::F8_E8M0, {rows, cols / 32}, s, {}});
      ++fp4;
    } else if (linear) {
      const int64_t rows = e.shape[0], cols = e.shape[1], sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      const uint8_t* w8 = bytes(size_t(rows * cols), fp8_code);
      const uint8_t* s = bytes(size_t(sr * sc), e8m0);
      std::vector<float> w(size_t(rows * cols));
      for (int64_t i = 0; i < rows * cols; ++i)
        w[size_t(i)] =
            fp8_e4m3_to_f32(w8[i]) * std::ldexp(1.f, int(s[(i / cols / 128) * sc + (i % cols) / 128]) - 127);
      want[n] = std::move(w);
      ts.push_back({n, DType::F8_E4M3, e.shape, w8, {}});
      ts.push_back({n.substr(0, n.size() - 7) + ".scale", DType::F8_E8M0, {sr, sc}, s, {}});
      ++fp8;
    } else if (e.dtype == DType::I64) {
      const size_t count = size_t(numel(e.shape));
      const uint8_t* raw = bytes(count * 8, [] { return uint8_t(0); });
      auto* ids = reinterpret_cast<int64_t*>(const_cast<uint8_t*>(raw));
      for (size_t i = 0; i < count; ++i) ids[i] = int64_t(rng() % 8);
      ts.push_back({n, DType::I64, e.shape, raw, {}});
    } else {
      const size_t count = size_t(numel(e.shape));
      const uint8_t* raw = bytes(count * 2, [] { return uint8_t(0); });
      auto* h = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(raw));
      std::vector<float> w(count);
      for (size_t i = 0; i < count; ++i) {
        h[i] = f32_to_bf16(float(int(rng() % 2001) - 1000) / 256.f);
        w[i] = bf16_to_f32(h[i]);
      }
      want[n] = std::move(w);
      ts.push_back({n, DType::BF16, e.shape, raw, {}});
    }
  }
  ckpt::write_safetensors_sharded(dir.path(), ts, 200 << 10);
  StateDict sd = load_state_dict(dir.path(), cfg);
  EXPECT_EQ(fp4, 5 * 8 * 3);
  EXPECT_GT(fp8, 5 * 5);
  for (const auto& [n, w] : want) {
    const HostTensor& t = sd.at(n);
    ASSERT_EQ(size_t(t.numel()), w.size()) << n;
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(t.f32()[i], w[i]) << n << " element " << i;
  }
}

TEST(Dequant, E8M0FnuSpellingIsAccepted) {
  ScratchDir dir("fnu");
  trex::test::write_bytes(
      dir / "s.safetensors",
      trex::test::raw_safetensors(R"({"s":{"dtype":"F8_E8M0FNU","shape":[2],"data_offsets":[0,2]}})", 2));
  ckpt::SafetensorsFile f(dir / "s.safetensors");
  EXPECT_EQ(f.find("s")->dtype, DType::F8_E8M0);
}
