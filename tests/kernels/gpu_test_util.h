// Helpers shared by the GPU-vs-CPU kernel tests: random bf16 data (bits and the exact values they hold),
// relative L2 error (non-finite output fails), NaN-poisoned device outputs.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/device_buffer.h"

namespace trex::gpu_test {

struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> values;  // the exact values the bits hold
};

inline Bf16Data random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  Bf16Data r;
  r.bits.resize(n);
  r.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    r.bits[i] = trex::f32_to_bf16(d(g));
    r.values[i] = trex::bf16_to_f32(r.bits[i]);
  }
  return r;
}

inline std::vector<float> random_f32(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<float> to_f32(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = trex::bf16_to_f32(bits[i]);
  return v;
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Relative L2 distance of a tensor from a reference that may be all zeros (then the absolute L2 distance); INFINITY
// when `a` has a non-finite element. The multi-rank training tests compare gradients and weights with it.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

template <typename T>
trex::cuda::DeviceBuffer poisoned(size_t count) {
  trex::cuda::DeviceBuffer b(count * sizeof(T));
  TREX_CUDA(cudaMemset(b.as(), 0xff, b.bytes()));  // NaN in bf16/fp32, -1 in ints: unwritten outputs fail
  return b;
}

template <typename T>
trex::cuda::DeviceBuffer zeroed(size_t count) {
  trex::cuda::DeviceBuffer b(count * sizeof(T));
  TREX_CUDA(cudaMemset(b.as(), 0, b.bytes()));
  return b;
}

}  // namespace trex::gpu_test
