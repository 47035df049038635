// The CUDA mHC site (mixing, Sinkhorn, collapse), expand and their backward passes against
// trex::dsv4::mhc_* (src/model/dsv4/mhc.cpp, compiled into this test as the reference) in fp32 on the same
// bf16 streams. N is not a multiple of the 8 tokens a block serves.
// Tolerances (relative L2): mix, rstd, pre, post, comb 1e-5 (fp32 both sides, other summation order);
// collapsed and Xout 1e-2 (bf16 outputs); expand backward 1e-5; site backward (dX, dfn, dbase, dscale) 1e-4
// (fp32 through 39 recomputed Sinkhorn steps against the CPU's fp32-with-fp64-sums).
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "kernels/cuda/mhc.h"
#include "model/dsv4/mhc.h"  // the CPU reference (trex_model)

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

TEST(GpuMhc, SiteExpandForwardBackwardMatchCpu) {
  const int64_t N = 37, n = 4, d = 256, M = 24, D = n * d;
  trex::dsv4::MhcShape cs;
  cs.n_tok = N;
  cs.n_hc = n;
  cs.d = d;
  auto X = random_bf16(N * D, 91), y = random_bf16(N * d, 92), dcol = random_bf16(N * d, 93);
  std::vector<float> fn = random_f32(M * D, 94, 0.03f), base = random_f32(M, 95, 0.5f),
                     dXout = random_f32(N * D, 96);
  std::vector<float> scale = {0.7f, 1.3f, 2.0f};

  // CPU reference.
  std::vector<float> mix(N * M), rstd(N), pre(N * n), post(N * n), comb(N * n * n), col(N * d), Xout(N * D);
  trex::dsv4::MhcSiteActs<float> acts{mix.data(), rstd.data(), pre.data(), post.data(), comb.data()};
  trex::dsv4::mhc_site_fwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), acts, col.data());
  trex::dsv4::mhc_expand_fwd(cs, X.values.data(), y.values.data(), post.data(), comb.data(), Xout.data());
  std::vector<float> dX_exp(N * D, 0.f), dy(N * d, 0.f), dpost(N * n), dcomb(N * n * n);
  trex::dsv4::mhc_expand_bwd(cs, X.values.data(), y.values.data(), post.data(), comb.data(), dXout.data(),
                             dX_exp.data(), dy.data(), dpost.data(), dcomb.data());
  std::vector<float> dX(N * D, 0.f), dfn(M * D, 0.f), dbase(M, 0.f), dscale(3, 0.f), scratch(N * M);
  trex::dsv4::mhc_site_bwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), acts,
                           dcol.values.data(), dpost.data(), dcomb.data(), dX.data(), dfn.data(),
                           dbase.data(), dscale.data(), scratch.data());

  // GPU.
  trex::cuda::MhcDims gs;
  gs.n_tok = N;
  gs.d = d;
  auto d_X = DeviceBuffer::from_host(X.bits), d_y = DeviceBuffer::from_host(y.bits),
       d_dcol = DeviceBuffer::from_host(dcol.bits), d_fn = DeviceBuffer::from_host(fn),
       d_base = DeviceBuffer::from_host(base), d_scale = DeviceBuffer::from_host(scale),
       d_dXout = DeviceBuffer::from_host(dXout);
  auto g_mix = poisoned<float>(N * M), g_rstd = poisoned<float>(N), g_pre = poisoned<float>(N * n),
       g_post = poisoned<float>(N * n), g_comb = poisoned<float>(N * n * n),
       g_col = poisoned<uint16_t>(N * d), g_Xout = poisoned<uint16_t>(N * D),
       g_dpost = poisoned<float>(N * n), g_dcomb = poisoned<float>(N * n * n);
  auto g_dXe = zeroed<float>(N * D), g_dy = zeroed<float>(N * d), g_dX = zeroed<float>(N * D),
       g_dfn = zeroed<float>(M * D), g_dbase = zeroed<float>(M), g_dscale = zeroed<float>(3);
  auto g_scratch = poisoned<float>(trex::cuda::mhc_site_bwd_scratch(gs));
  trex::cuda::MhcActs ga{g_mix.as<float>(), g_rstd.as<float>(), g_pre.as<float>(), g_post.as<float>(),
                         g_comb.as<float>()};
  trex::cuda::mhc_site_fwd(gs, d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(), ga,
                           g_col.as<bf16>());
  trex::cuda::mhc_expand_fwd(gs, d_X.as<bf16>(), d_y.as<bf16>(), g_post.as<float>(), g_comb.as<float>(),
                             g_Xout.as<bf16>());
  trex::cuda::mhc_expand_bwd(gs, d_X.as<bf16>(), d_y.as<bf16>(), g_post.as<float>(), g_comb.as<float>(),
                             d_dXout.as<float>(), g_dXe.as<float>(), g_dy.as<float>(), g_dpost.as<float>(),
                             g_dcomb.as<float>());
  trex::cuda::mhc_site_bwd(gs, d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(), ga,
                           d_dcol.as<bf16>(), g_dpost.as<float>(), g_dcomb.as<float>(), g_dX.as<float>(),
                           g_dfn.as<float>(), g_dbase.as<float>(), g_dscale.as<float>(),
                           g_scratch.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_mix.to_host<float>(), mix), 1e-5);
  EXPECT_LT(rel_err(g_rstd.to_host<float>(), rstd), 1e-5);
  EXPECT_LT(rel_err(g_pre.to_host<float>(), pre), 1e-5);
  EXPECT_LT(rel_err(g_post.to_host<float>(), post), 1e-5);
  EXPECT_LT(rel_err(g_comb.to_host<float>(), comb), 1e-5);
  EXPECT_LT(rel_err(to_f32(g_col.to_host<uint16_t>()), col), 1e-2);
  EXPECT_LT(rel_err(to_f32(g_Xout.to_host<uint16_t>()), Xout), 1e-2);
  EXPECT_LT(rel_err(g_dXe.to_host<float>(), dX_exp), 1e-5);
  EXPECT_LT(rel_err(g_dy.to_host<float>(), dy), 1e-5);
  EXPECT_LT(rel_err(g_dpost.to_host<float>(), dpost), 1e-5);
  EXPECT_LT(rel_err(g_dcomb.to_host<float>(), dcomb), 1e-5);
  EXPECT_LT(rel_err(g_dX.to_host<float>(), dX), 1e-4);
  EXPECT_LT(rel_err(g_dfn.to_host<float>(), dfn), 1e-4);
  EXPECT_LT(rel_err(g_dbase.to_host<float>(), dbase), 1e-4);
  EXPECT_LT(rel_err(g_dscale.to_host<float>(), dscale), 1e-4);
}
