#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace trex {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  int bits;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F64, "F64", 64},         {DType::F32, "F32", 32},     {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},       {DType::F8_E4M3, "F8_E4M3", 8}, {DType::F8_E8M0, "F8_E8M0", 8},
    {DType::F4_E2M1, "F4_E2M1", 4},  {DType::I64, "I64", 64},     {DType::I32, "I32", 32},
    {DType::I16, "I16", 16},         {DType::I8, "I8", 8},        {DType::U8, "U8", 8},
    {DType::BOOL, "BOOL", 8},
};
const DTypeInfo& info(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i;
  fail("internal error: unknown dtype {}", int(t));
}
}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
std::string_view dtype_name(DType t) { return info(t).name; }

bool dtype_from_name(std::string_view s, DType* out) {
  for (const auto& i : kInfo)
    if (s == i.name) {
      *out = i.type;
      return true;
    }
  if (s == "F8_E8M0FNU" || s == "E8M0") {  // spellings seen in the wild
    *out = DType::F8_E8M0;
    return true;
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal
      float f = std::ldexp(float(man), -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.f) return sign | 0x7c00u;
  if (a < 6.103515625e-05f) {  // subnormal range: quantise to multiples of 2^-24, ties to even
    float q = std::nearbyint(a * 16777216.f);
    return sign | uint16_t(q);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float q = std::nearbyint(m * 2048.f);  // 11 significant bits
  if (q == 2048.f) {
    q = 1024.f;
    e += 1;
  }
  uint16_t exp = uint16_t(e - 1 + 15);
  if (exp >= 31) return sign | 0x7c00u;
  return sign | uint16_t(exp << 10) | uint16_t(uint32_t(q) - 1024u);
}

float fp8_e4m3_to_f32(uint8_t v) {
  uint32_t sign = v & 0x80u;
  uint32_t exp = (v >> 3) & 0xfu;
  uint32_t man = v & 0x7u;
  if (exp == 15 && man == 7) return __builtin_nanf("");
  float f = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), int(exp) - 10);
  return sign ? -f : f;
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.f) return sign | 0x7e;  // saturate
  if (a < std::ldexp(1.f, -6)) {       // subnormal: multiples of 2^-9
    float q = std::nearbyint(a * 512.f);
    return sign | uint8_t(q);  // q == 8 lands on the smallest normal, which is code 8: consistent
  }
  int e;
  float m = std::frexp(a, &e);         // m in [0.5,1)
  float q = std::nearbyint(m * 16.f);  // 4 significant bits: 8..16
  if (q == 16.f) {
    q = 8.f;
    e += 1;
  }
  int exp = e - 1 + 7;
  if (exp > 15 || (exp == 15 && q - 8 > 6)) return sign | 0x7e;
  return sign | uint8_t(exp << 3) | uint8_t(int(q) - 8);
}

uint8_t f32_to_fp4_e2m1(float f) {
  static constexpr float kMag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  int best = 0;
  float best_err = INFINITY;
  for (int i = 0; i < 8; ++i) {
    float err = std::fabs(a - kMag[i]);
    if (err < best_err || (err == best_err && (i % 2) == 0)) {
      best = i;
      best_err = err;
    }
  }
  return sign | uint8_t(best);
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F64: {
      auto* s = static_cast<const double*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
      return;
    }
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(s[i]);
      return;
    }
    case DType::F8_E8M0: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = e8m0_to_f32(s[i]);
      return;
    }
    case DType::F4_E2M1: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp4_e2m1_to_f32((s[i / 2] >> ((i & 1) * 4)) & 0xf);
      return;
    }
    default:
      fail("cannot convert dtype {} to F32 (not a floating-point type)", dtype_name(t));
  }
}

void convert_from_f32(const float* src, DType t, void* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::F64: {
      auto* d = static_cast<double*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::F8_E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_fp8_e4m3(src[i]);
      return;
    }
    case DType::F4_E2M1: {
      auto* d = static_cast<uint8_t*>(dst);
      std::memset(d, 0, (n + 1) / 2);
      for (size_t i = 0; i < n; ++i) d[i / 2] |= uint8_t(f32_to_fp4_e2m1(src[i]) << ((i & 1) * 4));
      return;
    }
    default:
      fail("cannot convert F32 to dtype {}", dtype_name(t));
  }
}

}  // namespace trex
