// Element types and their scalar conversions. Storage dtypes of checkpoints (bf16, fp16, fp8 e4m3,
// fp4 e2m1 packed two per byte, e8m0 power-of-two scales) convert to and from fp32 exactly as the
// DeepSeek-V4 checkpoints define them (design §3.5). Compute is fp32 on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace trex {

enum class DType : uint8_t { F64, F32, F16, BF16, F8_E4M3, F8_E8M0, F4_E2M1, I64, I32, I16, I8, U8, BOOL };

// Bits per element (fp4 is 4: two per byte).
int dtype_bits(DType t);
inline size_t dtype_bytes(DType t, size_t count) { return (count * dtype_bits(t) + 7) / 8; }
std::string_view dtype_name(DType t);                 // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
bool dtype_from_name(std::string_view s, DType* out);  // false for unknown names

// --- scalar conversions -------------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN preserved.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// OCP float8 e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, max 448.
float fp8_e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);  // round to nearest even, saturates to +-448
// e8m0 (ue8m0): 2^(e-127); 255 is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 255) return __builtin_nanf("");
  uint32_t u = e == 0 ? 0x00400000u : uint32_t(e) << 23;  // e=0 -> 2^-127 (subnormal)
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// fp4 e2m1 nibble -> value: 0..7 = {0,.5,1,1.5,2,3,4,6}, bit 3 is the sign.
inline float fp4_e2m1_to_f32(uint8_t nibble) {
  static constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float m = kMag[nibble & 7];
  return (nibble & 8) ? -m : m;
}
uint8_t f32_to_fp4_e2m1(float f);  // nearest representable magnitude (ties to even code)

// Converts `count` elements of dtype `src_type` to fp32. For F4_E2M1 `count` counts logical
// elements (low nibble first). Throws for non-float types.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t count);
void convert_from_f32(const float* src, DType dst_type, void* dst, size_t count);

}  // namespace trex
