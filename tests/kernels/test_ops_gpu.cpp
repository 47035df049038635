// Every CUDA op against the CPU kernel of the same name (ggml's discipline), on random inputs, with
// bf16-appropriate tolerances (relative L2 error; the CPU side runs on the bf16-rounded inputs in fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/tensor_ops.h"
#include "kernels/gpu_test_util.h"

using trex::cuda::DeviceBuffer;

using namespace trex::gpu_test;

TEST(GpuOps, GemmBf16MatchesCpuAllTransposes) {
  trex::cuda::Gemm gemm;
  const int64_t m = 77, n = 129, k = 200;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      auto a = random_bf16(m * k, 1 + ta), b = random_bf16(k * n, 3 + tb);
      std::vector<float> ref(m * n);
      trex::cpu::gemm(ref.data(), a.values.data(), b.values.data(), m, n, k, ta, tb);
      auto da = DeviceBuffer::from_host(a.bits), db = DeviceBuffer::from_host(b.bits);
      auto dc = poisoned<float>(m * n);
      trex::cuda::GemmShape s{m, n, k, bool(ta), bool(tb), trex::cuda::GemmType::BF16, trex::cuda::GemmType::F32};
      gemm.run(s, da.as(), db.as(), dc.as());
      TREX_CUDA(cudaDeviceSynchronize());
      EXPECT_LT(rel_err(dc.to_host<float>(), ref), 1e-5) << "trans_a=" << ta << " trans_b=" << tb;
    }
}

// The plan cache keys varying extents by class (four per octave): every extent of a class must still compute its
// own exact product (the layouts are re-described per call), and the heuristic must run once per class, not once
// per extent — the per-expert GEMMs of MoE see new row counts every step.
TEST(GpuOps, GemmExtentClassesServeEveryExtentExactly) {
  using trex::cuda::Gemm;
  for (int64_t x : {1, 7, 16, 17, 20, 21, 33, 100, 513, 640, 641, 777, 1000, 4096, 4097, 49152}) {
    const int64_t c = Gemm::extent_class(x);
    EXPECT_GE(c, x);
    EXPECT_LE(c, x <= 16 ? x : x + x / 4 + 4) << x;
    EXPECT_EQ(Gemm::extent_class(c), c) << "a class's representative is its own class: " << x;
  }
  EXPECT_EQ(Gemm::extent_class(8192), 8192);  // powers of two keep their exact algorithm
  Gemm gemm;
  const int64_t n = 96, fixed = 136;
  // (trans_a, trans_b, which extent varies): forward y = x W^T (m), dx = dy W (m), dW += dy^T x (k, beta = 1).
  struct Form { bool ta, tb, vary_k; float beta; };
  const std::vector<int64_t> extents = {700, 650, 777, 1000, 513, 640, 999, 3, 1, 12, 700};
  int64_t seed = 11;
  for (const Form f : {Form{false, true, false, 0.f}, Form{false, false, false, 0.f}, Form{true, false, true, 1.f}}) {
    const int64_t calls0 = gemm.heuristic_calls();
    std::vector<int64_t> classes;
    for (int64_t e : extents) {
      const int64_t m = f.vary_k ? fixed : e, k = f.vary_k ? e : fixed;
      auto a = random_bf16(m * k, int(++seed)), b = random_bf16(k * n, int(++seed));
      std::vector<float> ref(size_t(m * n), 0.f), c0(size_t(m * n), 0.f);
      if (f.beta != 0.f) {
        auto init = random_bf16(m * n, int(++seed));
        c0 = init.values;
      }
      trex::cpu::gemm(ref.data(), a.values.data(), b.values.data(), m, n, k, f.ta, f.tb);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += f.beta * c0[i];
      auto da = DeviceBuffer::from_host(a.bits), db = DeviceBuffer::from_host(b.bits);
      auto dc = DeviceBuffer::from_host(c0);
      trex::cuda::GemmShape s{m, n, k, f.ta, f.tb, trex::cuda::GemmType::BF16, trex::cuda::GemmType::F32};
      gemm.run(s, da.as(), db.as(), dc.as(), 1.f, f.beta);
      TREX_CUDA(cudaDeviceSynchronize());
      EXPECT_LT(rel_err(dc.to_host<float>(), ref), 1e-5) << "ta=" << f.ta << " tb=" << f.tb << " m=" << m << " k=" << k;
      const int64_t cls = Gemm::extent_class(e);
      if (std::find(classes.begin(), classes.end(), cls) == classes.end()) classes.push_back(cls);
    }
    EXPECT_LE(gemm.heuristic_calls() - calls0, int64_t(classes.size()))
        << "one heuristic query per extent class (ta=" << f.ta << " tb=" << f.tb << ")";
  }
}

namespace {

// d % 8 == 0 takes the 16-byte vector path, other widths the scalar one.
void check_rmsnorm(int64_t n, int64_t d) {
  auto x = random_bf16(n * d, 5), w = random_bf16(d, 6), dy = random_bf16(n * d, 7);
  std::vector<float> y(n * d), rstd(n), dx(n * d, 0.f), dw(d, 0.f);
  trex::cpu::rmsnorm_fwd(y.data(), rstd.data(), x.values.data(), w.values.data(), n, d, 1e-6);
  trex::cpu::rmsnorm_bwd(dx.data(), dw.data(), dy.values.data(), x.values.data(), w.values.data(), rstd.data(), n, d);
  auto dx_ = DeviceBuffer::from_host(x.bits), dw_ = DeviceBuffer::from_host(w.bits), ddy = DeviceBuffer::from_host(dy.bits);
  auto gy = poisoned<uint16_t>(n * d), grstd = poisoned<float>(n), gdx = poisoned<uint16_t>(n * d);
  int64_t prow = trex::cuda::rmsnorm_dw_partial_rows(n);
  DeviceBuffer partial(prow * d * sizeof(float)), gdw(d * sizeof(float));
  TREX_CUDA(cudaMemset(gdw.as(), 0, gdw.bytes()));
  using trex::cuda::bf16;
  trex::cuda::rmsnorm_fwd(gy.as<bf16>(), grstd.as<float>(), dx_.as<bf16>(), dw_.as<bf16>(), n, d, 1e-6f);
  trex::cuda::rmsnorm_bwd(gdx.as<bf16>(), partial.as<float>(), ddy.as<bf16>(), dx_.as<bf16>(), dw_.as<bf16>(),
                          grstd.as<float>(), n, d);
  trex::cuda::rmsnorm_dw_reduce(gdw.as<float>(), partial.as<float>(), prow, d);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(to_f32(gy.to_host<uint16_t>()), y), 8e-3);
  EXPECT_LT(rel_err(grstd.to_host<float>(), rstd), 1e-5);
  EXPECT_LT(rel_err(to_f32(gdx.to_host<uint16_t>()), dx), 8e-3);
  EXPECT_LT(rel_err(gdw.to_host<float>(), dw), 1e-4);
}

}  // namespace

TEST(GpuOps, RmsNormForwardBackwardMatchesCpu) {
  check_rmsnorm(300, 1000);
}

TEST(GpuOps, RmsNormScalarWidthMatchesCpu) {
  check_rmsnorm(37, 1004);
}

// Widths <= 1024 take the warp-per-row backward (1, 2 or 4 chunks per lane; 333 rows: a partial last block),
// wider ones the block-per-row kernel.
TEST(GpuOps, RmsNormWarpRowAndWideWidthsMatchCpu) {
  check_rmsnorm(333, 512);
  check_rmsnorm(45, 128);
  check_rmsnorm(21, 2048);
}

TEST(GpuOps, ClampedSwigluForwardBackwardMatchesCpu) {
  const int64_t n = 257, f = 384;
  const float limit = 1.5f;  // small so both clamps are active on part of the data
  auto gu = random_bf16(n * 2 * f, 8, 2.0f), dh = random_bf16(n * f, 9);
  std::vector<float> gate(n * f), up(n * f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      gate[i * f + j] = gu.values[i * 2 * f + j];
      up[i * f + j] = gu.values[i * 2 * f + f + j];
    }
  std::vector<float> h(n * f), dgate(n * f), dup(n * f);
  trex::cpu::swiglu_fwd(h.data(), gate.data(), up.data(), n * f, limit);
  trex::cpu::swiglu_bwd(dgate.data(), dup.data(), dh.values.data(), gate.data(), up.data(), n * f, limit);
  auto dgu = DeviceBuffer::from_host(gu.bits), ddh = DeviceBuffer::from_host(dh.bits);
  auto gh = poisoned<uint16_t>(n * f), gdgu = poisoned<uint16_t>(n * 2 * f);
  using trex::cuda::bf16;
  trex::cuda::swiglu_fwd(gh.as<bf16>(), dgu.as<bf16>(), n, f, limit);
  trex::cuda::swiglu_bwd(gdgu.as<bf16>(), ddh.as<bf16>(), dgu.as<bf16>(), n, f, limit);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(to_f32(gh.to_host<uint16_t>()), h), 8e-3);
  auto g = to_f32(gdgu.to_host<uint16_t>());
  std::vector<float> gg(n * f), gu_(n * f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < f; ++j) {
      gg[i * f + j] = g[i * 2 * f + j];
      gu_[i * f + j] = g[i * 2 * f + f + j];
    }
  EXPECT_LT(rel_err(gg, dgate), 8e-3);
  EXPECT_LT(rel_err(gu_, dup), 8e-3);
}

// The fp64 sum of squares behind GPU gradient clipping: equal to the CPU's fp64 sum to rounding, the same bits on
// every call (fixed grid and order), and exact on sizes below, at and above one grid's worth.
TEST(GpuOps, SumSquaresMatchesFp64HostAndIsDeterministic) {
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(256 * 1024), int64_t(3 * 256 * 1024 + 17)}) {
    const std::vector<float> x = random_f32(n, 91 + int(n % 7));
    double ref = 0;
    for (float v : x) ref += double(v) * double(v);
    auto dx = DeviceBuffer::from_host(x);
    DeviceBuffer scratch((trex::cuda::kSumSquaresBlocks + 1) * sizeof(double));
    double got[2];
    for (int rep = 0; rep < 2; ++rep) {
      trex::cuda::sum_squares_f32(dx.as<float>(), n, scratch.as<double>());
      TREX_CUDA(cudaMemcpy(&got[rep], scratch.as<double>(), sizeof(double), cudaMemcpyDeviceToHost));
    }
    EXPECT_NEAR(got[0], ref, 1e-12 * ref) << "n = " << n;
    EXPECT_EQ(got[0], got[1]) << "n = " << n << ": two calls differ";
  }
}

// The embedding backward groups the tokens by id and sums each group in position order (no atomics): the same
// batch gives the same table gradient bit for bit, equal to the CPU sum within fp32 rounding, rows of absent ids
// untouched.
TEST(GpuOps, EmbeddingBackwardIsDeterministicAndMatchesCpu) {
  const int64_t V = 97, d = 320, hc = 4, N = 3000;
  std::mt19937_64 g(11);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& t : ids) t = int32_t(g() % 7 == 0 ? 5 : g() % uint64_t(V - 10));  // one frequent id, ids >= V-10 absent
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> dX(static_cast<size_t>(N * hc * d)), table0(static_cast<size_t>(V * d));
  for (auto& x : dX) x = u(g);
  for (auto& x : table0) x = u(g);
  std::vector<float> ref = table0;
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < d; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < hc; ++i) acc += dX[size_t((t * hc + i) * d + j)];
      ref[size_t(ids[size_t(t)] * d + j)] += float(acc);
    }
  std::vector<int32_t> order, seg;
  trex::cuda::embed_bwd_plan(ids.data(), N, &order, &seg);
  ASSERT_EQ(order.size(), size_t(N));
  for (size_t s = 0; s + 1 < seg.size(); ++s)
    for (int32_t k = seg[s] + 1; k < seg[s + 1]; ++k) {
      ASSERT_EQ(ids[size_t(order[size_t(k)])], ids[size_t(order[size_t(seg[s])])]);
      ASSERT_LT(order[size_t(k - 1)], order[size_t(k)]);  // position order within a group
    }
  auto d_ids = trex::cuda::DeviceBuffer::from_host(ids), d_order = trex::cuda::DeviceBuffer::from_host(order);
  auto d_seg = trex::cuda::DeviceBuffer::from_host(seg), d_dX = trex::cuda::DeviceBuffer::from_host(dX);
  std::vector<float> runs[2];
  for (auto& r : runs) {
    auto d_table = trex::cuda::DeviceBuffer::from_host(table0);
    trex::cuda::embed_streams_bwd(d_table.as<float>(), d_ids.as<int32_t>(), d_order.as<int32_t>(),
                                  d_seg.as<int32_t>(), int64_t(seg.size()) - 1, d_dX.as<float>(), d, hc);
    r = d_table.to_host<float>();
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_LT(trex::gpu_test::rel_err(runs[0], ref), 1e-6);
  for (int64_t v = V - 10; v < V; ++v)
    for (int64_t j = 0; j < d; ++j) ASSERT_EQ(runs[0][size_t(v * d + j)], table0[size_t(v * d + j)]) << v;
}
