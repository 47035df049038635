// The CUDA mHC site (mixing, Sinkhorn, collapse), expand and their backward passes against
// trex::dsv4::mhc_* (src/model/dsv4/mhc.cpp, compiled into this test as the reference) in fp32 on the same
// bf16 streams. N is not a multiple of the 16 tokens a block serves; the second case's stream width (4d = 1056)
// is not a multiple of the 64 columns a weight-gradient block owns, and every accumulated gradient (dX, dy, dfn,
// dbase, dscale) starts from random values on both sides. The backward runs twice on the GPU: bitwise equal
// results (no atomics, fixed reduction order). The third case has enough tokens (1030) for the dfn reduction to
// split the tokens into two ranges (partials in scratch, summed in order). The site backward runs once more with
// the gate gradients given (dpre, the form the training step uses); the first case also runs the expand backward
// in its writing form (accumulate = false, dy as bf16) into NaN-poisoned buffers.
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

namespace {

std::vector<float> start_values(size_t n, uint32_t seed, bool random) {
  return random ? random_f32(n, seed, 0.5f) : std::vector<float>(n, 0.f);
}

void check_mhc(int64_t N, int64_t d, bool accumulate) {
  const int64_t n = 4, M = 24, D = n * d;
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
  const std::vector<float> dX_exp0 = start_values(N * D, 97, accumulate), dy0 = start_values(N * d, 98, accumulate),
                           dX0 = start_values(N * D, 99, accumulate), dfn0 = start_values(M * D, 100, accumulate),
                           dbase0 = start_values(M, 101, accumulate), dscale0 = start_values(3, 102, accumulate);
  std::vector<float> dX_exp = dX_exp0, dy = dy0, dpost(N * n), dcomb(N * n * n);
  trex::dsv4::mhc_expand_bwd(cs, X.values.data(), y.values.data(), post.data(), comb.data(), dXout.data(),
                             dX_exp.data(), dy.data(), dpost.data(), dcomb.data());
  std::vector<float> dX = dX0, dfn = dfn0, dbase = dbase0, dscale = dscale0, scratch(N * M);
  trex::dsv4::mhc_site_bwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), acts,
                           dcol.values.data(), dpost.data(), dcomb.data(), dX.data(), dfn.data(),
                           dbase.data(), dscale.data(), scratch.data());

  // GPU.
  trex::cuda::MhcDims gs;
  gs.n_tok = N;
  gs.d = d;
  auto d_X = DeviceBuffer::from_host(X.bits), d_y = DeviceBuffer::from_host(y.bits),
       d_dcol = DeviceBuffer::from_host(dcol.values), d_fn = DeviceBuffer::from_host(fn),
       d_base = DeviceBuffer::from_host(base), d_scale = DeviceBuffer::from_host(scale),
       d_dXout = DeviceBuffer::from_host(dXout);
  auto g_mix = poisoned<float>(N * M), g_rstd = poisoned<float>(N), g_pre = poisoned<float>(N * n),
       g_post = poisoned<float>(N * n), g_comb = poisoned<float>(N * n * n),
       g_col = poisoned<uint16_t>(N * d), g_Xout = poisoned<uint16_t>(N * D),
       g_dpost = poisoned<float>(N * n), g_dcomb = poisoned<float>(N * n * n);
  auto g_dXe = DeviceBuffer::from_host(dX_exp0), g_dy = DeviceBuffer::from_host(dy0),
       g_dX = DeviceBuffer::from_host(dX0), g_dfn = DeviceBuffer::from_host(dfn0),
       g_dbase = DeviceBuffer::from_host(dbase0), g_dscale = DeviceBuffer::from_host(dscale0);
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
                           d_dcol.as<float>(), g_dpost.as<float>(), g_dcomb.as<float>(), g_dX.as<float>(),
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

  // Same backward again from the same start: bitwise equal.
  auto h_dXe = DeviceBuffer::from_host(dX_exp0), h_dy = DeviceBuffer::from_host(dy0),
       h_dX = DeviceBuffer::from_host(dX0), h_dfn = DeviceBuffer::from_host(dfn0),
       h_dbase = DeviceBuffer::from_host(dbase0), h_dscale = DeviceBuffer::from_host(dscale0);
  trex::cuda::mhc_expand_bwd(gs, d_X.as<bf16>(), d_y.as<bf16>(), g_post.as<float>(), g_comb.as<float>(),
                             d_dXout.as<float>(), h_dXe.as<float>(), h_dy.as<float>(), g_dpost.as<float>(),
                             g_dcomb.as<float>());
  trex::cuda::mhc_site_bwd(gs, d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(), ga,
                           d_dcol.as<float>(), g_dpost.as<float>(), g_dcomb.as<float>(), h_dX.as<float>(),
                           h_dfn.as<float>(), h_dbase.as<float>(), h_dscale.as<float>(),
                           g_scratch.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(h_dXe.to_host<float>(), g_dXe.to_host<float>());
  EXPECT_EQ(h_dy.to_host<float>(), g_dy.to_host<float>());
  EXPECT_EQ(h_dX.to_host<float>(), g_dX.to_host<float>());
  EXPECT_EQ(h_dfn.to_host<float>(), g_dfn.to_host<float>());
  EXPECT_EQ(h_dbase.to_host<float>(), g_dbase.to_host<float>());
  EXPECT_EQ(h_dscale.to_host<float>(), g_dscale.to_host<float>());

  if (!accumulate) {  // the writing form (accumulate = false) into poisoned buffers, dy rounded to bf16
    auto w_dX = poisoned<float>(N * D), w_dyb = poisoned<uint16_t>(N * d), w_dpost = poisoned<float>(N * n),
         w_dcomb = poisoned<float>(N * n * n);
    trex::cuda::mhc_expand_bwd(gs, d_X.as<bf16>(), d_y.as<bf16>(), g_post.as<float>(), g_comb.as<float>(),
                               d_dXout.as<float>(), w_dX.as<float>(), nullptr, w_dpost.as<float>(),
                               w_dcomb.as<float>(), nullptr, false, w_dyb.as<bf16>());
    TREX_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(rel_err(w_dX.to_host<float>(), dX_exp), 1e-5) << "expand bwd, writing form";
    EXPECT_LT(rel_err(to_f32(w_dyb.to_host<uint16_t>()), dy), 1e-2) << "expand bwd, bf16 dy";
    EXPECT_EQ(w_dpost.to_host<float>(), g_dpost.to_host<float>());
    EXPECT_EQ(w_dcomb.to_host<float>(), g_dcomb.to_host<float>());
  }

  // The gate gradients given (dpre = dcol . X[i], as mhc_collapse_norm_bwd forms them): the same results.
  std::vector<float> dpre(N * n);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < n; ++i) {
      double acc = 0;
      for (int64_t e = 0; e < d; ++e) acc += double(dcol.values[t * d + e]) * X.values[t * D + i * d + e];
      dpre[t * n + i] = float(acc);
    }
  auto d_dpre = DeviceBuffer::from_host(dpre);
  auto k_dX = DeviceBuffer::from_host(dX0), k_dfn = DeviceBuffer::from_host(dfn0),
       k_dbase = DeviceBuffer::from_host(dbase0), k_dscale = DeviceBuffer::from_host(dscale0);
  trex::cuda::mhc_site_bwd(gs, d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(), d_scale.as<float>(), ga,
                           d_dcol.as<float>(), g_dpost.as<float>(), g_dcomb.as<float>(), k_dX.as<float>(),
                           k_dfn.as<float>(), k_dbase.as<float>(), k_dscale.as<float>(), g_scratch.as<float>(),
                           nullptr, d_dpre.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(k_dX.to_host<float>(), dX), 1e-4) << "with dpre";
  EXPECT_LT(rel_err(k_dfn.to_host<float>(), dfn), 1e-4) << "with dpre";
  EXPECT_LT(rel_err(k_dbase.to_host<float>(), dbase), 1e-4) << "with dpre";
  EXPECT_LT(rel_err(k_dscale.to_host<float>(), dscale), 1e-4) << "with dpre";
}

}  // namespace

TEST(GpuMhc, SiteExpandForwardBackwardMatchCpu) {
  check_mhc(37, 256, false);
}

TEST(GpuMhc, BackwardAccumulatesOddWidthDeterministic) {
  check_mhc(45, 264, true);
}

TEST(GpuMhc, BackwardTokenSplitWeightGradMatchesCpu) {
  check_mhc(1030, 64, true);
}

// Few tokens (a decode step): the forward projection is split over a cluster of 16 blocks (1 token) or 4
// (200 tokens = 13 token blocks); 37 and 45 tokens above use 16, 1030 the single-block form.
TEST(GpuMhc, FewTokensClusterSplitProjectionMatchesCpu) {
  check_mhc(1, 256, false);
  check_mhc(200, 64, true);
}
