#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace {
std::vector<float> randv(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST(Matmul, LinearForwardBackwardAgainstLoops) {
  const int64_t n = 5, in = 7, out = 3;
  auto x = randv(n * in, 1), w = randv(out * in, 2), dy = randv(n * out, 3);
  std::vector<float> y(n * out), dx(n * in, 0.f), dw(out * in, 0.f);
  trex::cpu::linear_fwd(y.data(), x.data(), w.data(), n, in, out);
  trex::cpu::linear_bwd(dx.data(), dw.data(), dy.data(), x.data(), w.data(), n, in, out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += double(x[i * in + k]) * w[o * in + k];
      EXPECT_NEAR(y[i * out + o], s, 1e-4);
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < in; ++k) {
      double s = 0;
      for (int64_t o = 0; o < out; ++o) s += double(dy[i * out + o]) * w[o * in + k];
      EXPECT_NEAR(dx[i * in + k], s, 1e-4);
    }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += double(dy[i * out + o]) * x[i * in + k];
      EXPECT_NEAR(dw[o * in + k], s, 1e-4);
    }
}
