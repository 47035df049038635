// The CUDA hc_head collapse (src/kernels/cuda/hc_head.cu) and its backward against trex::dsv4::hc_head_fwd /
// hc_head_bwd (src/model/dsv4/mhc.cpp, the CPU reference) in fp32 on the same bf16 streams. N = 45 tokens; the
// stream width 4d = 1056 is not a multiple of the 64 columns a dfn block owns. Every accumulated gradient (dX,
// dfn, dbase, dscale) starts from random values on both sides; the backward runs twice on the GPU and must give
// bitwise equal results (fixed reduction order, no atomics).
// Tolerances (relative L2): mix, rstd, w 1e-5 (fp32 both sides, other summation order); y 1e-2 (bf16 output);
// dX, dfn, dbase, dscale 1e-4 (fp32 against the CPU's fp32-with-fp64-sums).
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "kernels/cuda/hc_head.h"
#include "model/dsv4/mhc.h"  // the CPU reference (trex_model)

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

TEST(GpuHcHead, ForwardBackwardMatchCpuAccumulateDeterministic) {
  const int64_t N = 45, n = 4, d = 264, D = n * d;
  trex::dsv4::MhcShape cs;
  cs.n_tok = N;
  cs.n_hc = n;
  cs.d = d;
  auto X = random_bf16(N * D, 71), dy = random_bf16(N * d, 72);
  const std::vector<float> fn = random_f32(n * D, 73, 0.03f), base = random_f32(n, 74, 0.5f), scale = {0.8f};
  const std::vector<float> dX0 = random_f32(N * D, 75, 0.5f), dfn0 = random_f32(n * D, 76, 0.5f),
                           dbase0 = random_f32(n, 77, 0.5f), dscale0 = random_f32(1, 78, 0.5f);

  // CPU reference.
  std::vector<float> mix(N * n), rstd(N), w(N * n), y(N * d), scratch(N * n);
  trex::dsv4::hc_head_fwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(),
                          w.data(), y.data());
  std::vector<float> dX = dX0, dfn = dfn0, dbase = dbase0, dscale = dscale0;
  trex::dsv4::hc_head_bwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(),
                          w.data(), dy.values.data(), dX.data(), dfn.data(), dbase.data(), dscale.data(),
                          scratch.data());

  // GPU.
  auto d_X = DeviceBuffer::from_host(X.bits), d_dy = DeviceBuffer::from_host(dy.values),
       d_fn = DeviceBuffer::from_host(fn), d_base = DeviceBuffer::from_host(base),
       d_scale = DeviceBuffer::from_host(scale);
  auto g_mix = poisoned<float>(N * n), g_rstd = poisoned<float>(N), g_w = poisoned<float>(N * n),
       g_y = poisoned<uint16_t>(N * d), g_scratch = poisoned<float>(trex::cuda::hc_head_bwd_scratch(N));
  trex::cuda::hc_head_fwd(g_y.as<bf16>(), g_mix.as<float>(), g_rstd.as<float>(), g_w.as<float>(), d_X.as<bf16>(),
                          d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(), N, d, float(cs.hc_eps),
                          float(cs.rms_eps));
  auto run_bwd = [&](DeviceBuffer& gX, DeviceBuffer& gfn, DeviceBuffer& gbase, DeviceBuffer& gscale) {
    trex::cuda::hc_head_bwd(gX.as<float>(), gfn.as<float>(), gbase.as<float>(), gscale.as<float>(), d_dy.as<float>(),
                            d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(),
                            g_mix.as<float>(), g_rstd.as<float>(), g_w.as<float>(), N, d, g_scratch.as<float>());
  };
  auto g_dX = DeviceBuffer::from_host(dX0), g_dfn = DeviceBuffer::from_host(dfn0),
       g_dbase = DeviceBuffer::from_host(dbase0), g_dscale = DeviceBuffer::from_host(dscale0);
  auto h_dX = DeviceBuffer::from_host(dX0), h_dfn = DeviceBuffer::from_host(dfn0),
       h_dbase = DeviceBuffer::from_host(dbase0), h_dscale = DeviceBuffer::from_host(dscale0);
  run_bwd(g_dX, g_dfn, g_dbase, g_dscale);
  run_bwd(h_dX, h_dfn, h_dbase, h_dscale);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_mix.to_host<float>(), mix), 1e-5);
  EXPECT_LT(rel_err(g_rstd.to_host<float>(), rstd), 1e-5);
  EXPECT_LT(rel_err(g_w.to_host<float>(), w), 1e-5);
  EXPECT_LT(rel_err(to_f32(g_y.to_host<uint16_t>()), y), 1e-2);
  EXPECT_LT(rel_err(g_dX.to_host<float>(), dX), 1e-4);
  EXPECT_LT(rel_err(g_dfn.to_host<float>(), dfn), 1e-4);
  EXPECT_LT(rel_err(g_dbase.to_host<float>(), dbase), 1e-4);
  EXPECT_LT(rel_err(g_dscale.to_host<float>(), dscale), 1e-4);
  EXPECT_EQ(h_dX.to_host<float>(), g_dX.to_host<float>());
  EXPECT_EQ(h_dfn.to_host<float>(), g_dfn.to_host<float>());
  EXPECT_EQ(h_dbase.to_host<float>(), g_dbase.to_host<float>());
  EXPECT_EQ(h_dscale.to_host<float>(), g_dscale.to_host<float>());

  // The gate gradients given (dpre = dy . X[i], as mhc_collapse_norm_bwd forms them): the same results.
  std::vector<float> dpre(N * n);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += double(dy.values[t * d + e]) * X.values[t * D + i * d + e];
      dpre[t * n + i] = float(acc);
    }
  auto d_dpre = DeviceBuffer::from_host(dpre);
  auto k_dX = DeviceBuffer::from_host(dX0), k_dfn = DeviceBuffer::from_host(dfn0),
       k_dbase = DeviceBuffer::from_host(dbase0), k_dscale = DeviceBuffer::from_host(dscale0);
  trex::cuda::hc_head_bwd(k_dX.as<float>(), k_dfn.as<float>(), k_dbase.as<float>(), k_dscale.as<float>(),
                          d_dy.as<float>(), d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(),
                          g_mix.as<float>(), g_rstd.as<float>(), g_w.as<float>(), N, d, g_scratch.as<float>(), nullptr,
                          d_dpre.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(k_dX.to_host<float>(), dX), 1e-4) << "with dpre";
  EXPECT_LT(rel_err(k_dfn.to_host<float>(), dfn), 1e-4) << "with dpre";
  EXPECT_LT(rel_err(k_dbase.to_host<float>(), dbase), 1e-4) << "with dpre";
  EXPECT_LT(rel_err(k_dscale.to_host<float>(), dscale), 1e-4) << "with dpre";

  // The writing form (accumulate = false, as the training step calls it): dX into a NaN-poisoned buffer equals
  // the CPU backward from a zero dX; the parameter gradients still accumulate.
  std::vector<float> zX(N * D, 0.f), zfn = dfn0, zbase = dbase0, zscale = dscale0;
  trex::dsv4::hc_head_bwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(),
                          w.data(), dy.values.data(), zX.data(), zfn.data(), zbase.data(), zscale.data(),
                          scratch.data());
  auto p_dX = poisoned<float>(N * D), p_dfn = DeviceBuffer::from_host(dfn0), p_dbase = DeviceBuffer::from_host(dbase0),
       p_dscale = DeviceBuffer::from_host(dscale0);
  trex::cuda::hc_head_bwd(p_dX.as<float>(), p_dfn.as<float>(), p_dbase.as<float>(), p_dscale.as<float>(),
                          d_dy.as<float>(), d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(),
                          g_mix.as<float>(), g_rstd.as<float>(), g_w.as<float>(), N, d, g_scratch.as<float>(), nullptr,
                          d_dpre.as<float>(), /*accumulate=*/false);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(p_dX.to_host<float>(), zX), 1e-4) << "writing form";
  EXPECT_LT(rel_err(p_dfn.to_host<float>(), zfn), 1e-4) << "writing form";
  EXPECT_LT(rel_err(p_dbase.to_host<float>(), zbase), 1e-4) << "writing form";
  EXPECT_LT(rel_err(p_dscale.to_host<float>(), zscale), 1e-4) << "writing form";
}
