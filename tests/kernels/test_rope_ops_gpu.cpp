// The attention's fused element-wise kernels against host references: per-head RMSNorm + RoPE (forward and
// the weightless backward), RoPE fused with the group permutation of the output projection, and the 16-byte
// path of permute_groups. References: trex::cpu::rmsnorm_fwd / _bwd and trex::dsv4::rope_rotate in fp32 on the
// bf16 inputs, with the bf16 rounding the unfused GPU sequence makes between its launches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/tensor_ops.h"
#include "kernels/gpu_test_util.h"
#include "model/dsv4/rope.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

namespace {

float round_bf16(float v) { return trex::bf16_to_f32(trex::f32_to_bf16(v)); }

// A rope table of n_pos positions and r/2 pairs (angles pos * f_k), random positions per row.
struct Rope {
  int64_t n_pos = 0, pairs = 0;
  std::vector<float> cos, sin;
  std::vector<int32_t> pos;
  DeviceBuffer dcos, dsin, dpos;
  Rope(int64_t rows, int64_t r, uint32_t seed) : n_pos(97), pairs(r / 2) {
    for (int64_t p = 0; p < n_pos; ++p)
      for (int64_t k = 0; k < pairs; ++k) {
        const double ang = double(p) * std::pow(10000.0, -2.0 * double(k) / double(r));
        cos.push_back(float(std::cos(ang))), sin.push_back(float(std::sin(ang)));
      }
    std::mt19937 g(seed);
    for (int64_t i = 0; i < rows; ++i) pos.push_back(int32_t(g() % uint32_t(n_pos)));
    dcos = DeviceBuffer::from_host(cos), dsin = DeviceBuffer::from_host(sin), dpos = DeviceBuffer::from_host(pos);
  }
  trex::cuda::RopeArgs args(int64_t rows, int64_t heads, int64_t c, int64_t r, int sign) {
    trex::cuda::RopeArgs a;
    a.rows = rows, a.heads = heads, a.c = c, a.rope_dim = r, a.pos = dpos.as<int32_t>();
    a.cos = dcos.as<float>(), a.sin = dsin.as<float>(), a.sign = sign;
    return a;
  }
  // Host rotation of every head vector of x [rows, heads, c] (bf16 rounding after, as the GPU stores it).
  void apply(std::vector<float>& x, int64_t rows, int64_t heads, int64_t c, int64_t r, int sign,
             bool round = true) const {
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.data() + (t * heads + h) * c + (c - r);
        trex::dsv4::rope_rotate(v, cos.data() + pos[size_t(t)] * pairs, sin.data() + pos[size_t(t)] * pairs,
                                pairs, sign);
        if (round)
          for (int64_t j = 0; j < r; ++j) v[j] = round_bf16(v[j]);
      }
  }
};

void check_rmsnorm_rope(int64_t rows, int64_t heads, int64_t c, int64_t r, bool weighted) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " heads " << heads << " c " << c << " r " << r
                                  << (weighted ? " weighted" : ""));
  const int64_t n = rows * heads;
  auto x = random_bf16(size_t(n * c), 11, 2.f), w = random_bf16(size_t(c), 12), dy = random_bf16(size_t(n * c), 13);
  Rope rope(rows, r, 14);
  // Forward reference: norm (rounded to bf16), then the rotation.
  std::vector<float> y(static_cast<size_t>(n * c)), rstd(static_cast<size_t>(n));
  trex::cpu::rmsnorm_fwd(y.data(), rstd.data(), x.values.data(), weighted ? w.values.data() : nullptr, n, c, 1e-6);
  for (auto& v : y) v = round_bf16(v);
  rope.apply(y, rows, heads, c, r, +1);
  // Backward reference (weightless): rotate dy back (rounded), then the norm's backward.
  std::vector<float> g = dy.values, dx(static_cast<size_t>(n * c), 0.f);
  rope.apply(g, rows, heads, c, r, -1);
  trex::cpu::rmsnorm_bwd(dx.data(), static_cast<float*>(nullptr), g.data(), x.values.data(),
                         static_cast<const float*>(nullptr), rstd.data(), n, c);

  auto gx = DeviceBuffer::from_host(x.bits), gw = DeviceBuffer::from_host(w.bits);
  auto gdy = DeviceBuffer::from_host(dy.bits);
  auto gy = poisoned<uint16_t>(size_t(n * c)), grstd = poisoned<float>(size_t(n));
  auto gdx = poisoned<uint16_t>(size_t(n * c));
  trex::cuda::rmsnorm_rope_fwd(gy.as<bf16>(), grstd.as<float>(), gx.as<bf16>(), weighted ? gw.as<bf16>() : nullptr,
                               1e-6f, rope.args(rows, heads, c, r, +1));
  trex::cuda::rope_rmsnorm_bwd(gdx.as<bf16>(), gdy.as<bf16>(), gx.as<bf16>(), grstd.as<float>(),
                               rope.args(rows, heads, c, r, -1));
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(to_f32(gy.to_host<uint16_t>()), y), 4e-3);
  EXPECT_LT(rel_err(grstd.to_host<float>(), rstd), 1e-5);
  EXPECT_LT(rel_err(to_f32(gdx.to_host<uint16_t>()), dx), 8e-3);
  EXPECT_EQ(gdy.to_host<uint16_t>(), dy.bits) << "dy must stay unchanged";
}

void check_rope_permute(int64_t N, int64_t H, int64_t G, int64_t c, int64_t r) {
  SCOPED_TRACE(testing::Message() << "N " << N << " H " << H << " G " << G << " c " << c << " r " << r);
  const int64_t X = H / G * c, n = N * H * c;
  auto o = random_bf16(size_t(n), 21), dg = random_bf16(size_t(n), 22);
  Rope rope(N, r, 23);
  // to group-major: og[g, t, x] = rope(o)[t, g X + x]
  std::vector<float> ro = o.values, og(static_cast<size_t>(n));
  rope.apply(ro, N, H, c, r, -1);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t x = 0; x < X; ++x) og[size_t((g * N + t) * X + x)] = ro[size_t(t * H * c + g * X + x)];
  // back: out[t, g X + x] = rope(dg[g, t, x])
  std::vector<float> back(static_cast<size_t>(n));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t x = 0; x < X; ++x) back[size_t(t * H * c + g * X + x)] = dg.values[size_t((g * N + t) * X + x)];
  rope.apply(back, N, H, c, r, +1);

  auto go = DeviceBuffer::from_host(o.bits), gdg = DeviceBuffer::from_host(dg.bits);
  auto gog = poisoned<uint16_t>(size_t(n)), gback = poisoned<uint16_t>(size_t(n));
  trex::cuda::rope_permute_groups(gog.as<bf16>(), go.as<bf16>(), G, rope.args(N, H, c, r, -1), true);
  trex::cuda::rope_permute_groups(gback.as<bf16>(), gdg.as<bf16>(), G, rope.args(N, H, c, r, +1), false);
  TREX_CUDA(cudaDeviceSynchronize());
  // One bf16 rounding of an fp32 rotation on both sides: equal up to the odd last-place tie.
  EXPECT_LT(rel_err(to_f32(gog.to_host<uint16_t>()), og), 1e-3);
  EXPECT_LT(rel_err(to_f32(gback.to_host<uint16_t>()), back), 1e-3);
  EXPECT_EQ(go.to_host<uint16_t>(), o.bits) << "the input must stay unchanged";
}

}  // namespace

TEST(GpuRopeOps, RmsNormRopeVectorWidths) {
  check_rmsnorm_rope(37, 4, 512, 64, false);  // the model's per-head q norm (2 chunks per lane)
  check_rmsnorm_rope(29, 1, 512, 64, true);   // kv / compressed entries
  check_rmsnorm_rope(53, 3, 128, 64, true);   // indexer width (half the lanes idle)
  check_rmsnorm_rope(17, 2, 1024, 64, false);  // 4 chunks per lane
  check_rmsnorm_rope(33, 2, 48, 16, true);    // a parity fixture's head width
}

TEST(GpuRopeOps, RmsNormRopeScalarWidths) {
  check_rmsnorm_rope(19, 3, 44, 8, true);    // c % 8 != 0: generic kernel
  check_rmsnorm_rope(11, 2, 1040, 64, false);  // wider than the register path
}

TEST(GpuRopeOps, RopePermuteGroupsMatchesReference) {
  check_rope_permute(67, 8, 2, 512, 64);  // 16-byte path
  check_rope_permute(45, 4, 4, 48, 16);
  check_rope_permute(31, 6, 3, 21, 6);    // c % 8 != 0: scalar path, pairs at odd offsets
}

TEST(GpuRopeOps, PermuteGroupsVectorPathIsExactPermutation) {
  for (int64_t X : {int64_t(1024), int64_t(40), int64_t(36)}) {  // 16-byte path twice, then the scalar one
    const int64_t N = 77, G = 4, n = N * G * X;
    auto a = random_bf16(size_t(n), 31);
    auto ga = DeviceBuffer::from_host(a.bits);
    auto gm = poisoned<uint16_t>(size_t(n)), back = poisoned<uint16_t>(size_t(n));
    trex::cuda::permute_groups(gm.as<bf16>(), ga.as<bf16>(), N, G, X, true);
    trex::cuda::permute_groups(back.as<bf16>(), gm.as<bf16>(), N, G, X, false);
    TREX_CUDA(cudaDeviceSynchronize());
    const auto h = gm.to_host<uint16_t>();
    bool ok = true;
    for (int64_t t = 0; t < N && ok; ++t)
      for (int64_t g = 0; g < G && ok; ++g)
        for (int64_t x = 0; x < X; ++x)
          if (h[size_t((g * N + t) * X + x)] != a.bits[size_t((t * G + g) * X + x)]) {
            ok = false;
            break;
          }
    EXPECT_TRUE(ok) << "X " << X << ": group-major layout wrong";
    EXPECT_EQ(back.to_host<uint16_t>(), a.bits) << "X " << X << ": round trip";
  }
}

TEST(GpuRopeOps, RopeApplyMatchesReference) {
  const int64_t rows = 41, heads = 3, c = 40, r = 16;
  auto x = random_bf16(size_t(rows * heads * c), 51);
  Rope rope(rows, r, 52);
  for (int sign : {+1, -1}) {
    std::vector<float> want = x.values;
    rope.apply(want, rows, heads, c, r, sign);  // bf16-rounded: the bf16 kernel's output
    auto gx = DeviceBuffer::from_host(x.bits);
    trex::cuda::rope_apply(gx.as<bf16>(), rope.args(rows, heads, c, r, sign));
    std::vector<float> want_f = x.values;
    rope.apply(want_f, rows, heads, c, r, sign, false);
    auto gf = DeviceBuffer::from_host(x.values);
    trex::cuda::rope_apply(gf.as<float>(), rope.args(rows, heads, c, r, sign));
    TREX_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(rel_err(to_f32(gx.to_host<uint16_t>()), want), 1e-3) << "bf16, sign " << sign;
    EXPECT_LT(rel_err(gf.to_host<float>(), want_f), 1e-6) << "fp32, sign " << sign;
  }
}
