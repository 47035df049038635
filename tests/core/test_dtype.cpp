#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"

using namespace trex;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even -> 1.0
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, Fp8E4M3AllCodesRoundTrip) {
  for (int code = 0; code < 256; ++code) {
    float v = fp8_e4m3_to_f32(uint8_t(code));
    if (std::isnan(v)) {
      EXPECT_TRUE((code & 0x7f) == 0x7f);
      continue;
    }
    uint8_t back = f32_to_fp8_e4m3(v);
    if (v == 0.0f) {
      EXPECT_EQ(back & 0x7f, 0);
    } else {
      EXPECT_EQ(back, code) << "value " << v;
    }
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_fp8_e4m3(1000.f), 0x7e);  // saturates
}

TEST(DType, Fp16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v);
  }
}

TEST(DType, E8M0AndFp4) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
  const float expect[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(fp4_e2m1_to_f32(uint8_t(i)), expect[i]);
  // Packed: low nibble first.
  uint8_t packed[2] = {0x72, 0xF1};  // elements: 1.0, 6.0, 0.5, -6.0
  std::vector<float> out(4);
  convert_to_f32(DType::F4_E2M1, packed, out.data(), 4);
  EXPECT_EQ(out, (std::vector<float>{1.0f, 6.0f, 0.5f, -6.0f}));
}
