// A deterministic pseudo-random tensor: element i of (seed, scale) is a function of those alone, the same on the
// host and on the device (comm/thread_group_device.cu), so a buffer filled either way holds the same bits. Values
// are uniform on [-sqrt(3), sqrt(3)) x scale: mean 0, standard deviation `scale`. The emulated group's pipeline
// boundary tensors (emulated_group.h) are made this way.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TREX_UNIFORM_HD __host__ __device__
#else
#define TREX_UNIFORM_HD
#endif

namespace trex::comm {

TREX_UNIFORM_HD inline float uniform_fill_value(uint64_t seed, uint64_t i, float scale) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits: exact in fp32
  return (2.0f * u - 1.0f) * 1.7320508f * scale;
}

// The bf16 bits of a finite float, rounded to nearest even (what __float2bfloat16 gives on the device).
TREX_UNIFORM_HD inline uint16_t uniform_fill_bf16_bits(float v) {
  uint32_t b = 0;
#if defined(__CUDA_ARCH__)
  b = __float_as_uint(v);
#else
  std::memcpy(&b, &v, sizeof(b));
#endif
  return uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

}  // namespace trex::comm
