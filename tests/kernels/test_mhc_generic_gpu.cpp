// The generic CUDA mHC and hc_head kernels (mhc_generic.h: any stream count 1..4, the fallback for hc_mult !=
// 4) against the CPU reference (src/model/dsv4/mhc.h) in fp32 on the same bf16-rounded streams, for n_hc = 2,
// 3 (the parity fixtures v4-tiny-c / v4-tiny-b) and 4. Each backward gets the CPU's forward activations, so
// every op is checked on its own. Tolerances (relative L2): bf16 outputs (collapsed, Xout, y) 1e-2 (2^-9
// rounding); fp32 outputs and gradients 1e-3 (fp32 sums in another order than the CPU's double ones, 39
// Sinkhorn steps).
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "kernels/cuda/mhc_generic.h"
#include "model/dsv4/mhc.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

namespace {

void run_mhc(int64_t n, uint32_t seed) {
  const int64_t N = 37, d = 16, D = n * d, M = (2 + n) * n;
  trex::dsv4::MhcShape cs;
  cs.n_tok = N, cs.n_hc = n, cs.d = d, cs.sinkhorn_iters = 20;
  trex::cuda::MhcDims gs;
  gs.n_tok = N, gs.d = d, gs.sinkhorn_iters = 20, gs.hc_eps = 1e-6f, gs.rms_eps = 1e-6f;
  auto X = random_bf16(N * D, seed), y = random_bf16(N * d, seed + 1), dcol = random_bf16(N * d, seed + 2);
  std::vector<float> fn = random_f32(M * D, seed + 3, 0.1f), base = random_f32(M, seed + 4, 0.5f),
                     scale = {0.8f, 1.1f, 1.3f}, dXout = random_f32(N * D, seed + 5),
                     dpost_in = random_f32(N * n, seed + 6), dcomb_in = random_f32(N * n * n, seed + 7);
  const std::string what = "n_hc=" + std::to_string(n);

  // Site forward.
  std::vector<float> mix(N * M), rstd(N), pre(N * n), post(N * n), comb(N * n * n), col(N * d);
  trex::dsv4::MhcSiteActs<float> ca{mix.data(), rstd.data(), pre.data(), post.data(), comb.data()};
  trex::dsv4::mhc_site_fwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), ca, col.data());
  auto d_X = DeviceBuffer::from_host(X.bits), d_y = DeviceBuffer::from_host(y.bits),
       d_dcol = DeviceBuffer::from_host(dcol.values), d_fn = DeviceBuffer::from_host(fn),
       d_base = DeviceBuffer::from_host(base), d_scale = DeviceBuffer::from_host(scale);
  auto g_mix = poisoned<float>(N * M), g_rstd = poisoned<float>(N), g_pre = poisoned<float>(N * n),
       g_post = poisoned<float>(N * n), g_comb = poisoned<float>(N * n * n),
       g_col = poisoned<uint16_t>(N * d);
  trex::cuda::MhcActs ga{g_mix.as<float>(), g_rstd.as<float>(), g_pre.as<float>(), g_post.as<float>(),
                         g_comb.as<float>()};
  trex::cuda::mhc_site_fwd_any(n, gs, d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(),
                               d_scale.as<float>(), ga, g_col.as<bf16>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_mix.to_host<float>(), mix), 1e-3) << what << " mix";
  EXPECT_LT(rel_err(g_rstd.to_host<float>(), rstd), 1e-3) << what << " rstd";
  EXPECT_LT(rel_err(g_pre.to_host<float>(), pre), 1e-3) << what << " pre";
  EXPECT_LT(rel_err(g_post.to_host<float>(), post), 1e-3) << what << " post";
  EXPECT_LT(rel_err(g_comb.to_host<float>(), comb), 1e-3) << what << " comb";
  EXPECT_LT(rel_err(to_f32(g_col.to_host<uint16_t>()), col), 1e-2) << what << " collapsed";

  // The CPU's activations on the device for the ops below.
  auto c_mix = DeviceBuffer::from_host(mix), c_rstd = DeviceBuffer::from_host(rstd),
       c_pre = DeviceBuffer::from_host(pre), c_post = DeviceBuffer::from_host(post),
       c_comb = DeviceBuffer::from_host(comb);
  trex::cuda::MhcActs cga{c_mix.as<float>(), c_rstd.as<float>(), c_pre.as<float>(), c_post.as<float>(),
                          c_comb.as<float>()};

  // Expand forward and backward.
  std::vector<float> Xout(N * D), dX(N * D, 0.f), dy(N * d, 0.f), dpost(N * n), dcomb(N * n * n);
  trex::dsv4::mhc_expand_fwd(cs, X.values.data(), y.values.data(), post.data(), comb.data(), Xout.data());
  trex::dsv4::mhc_expand_bwd(cs, X.values.data(), y.values.data(), post.data(), comb.data(), dXout.data(),
                             dX.data(), dy.data(), dpost.data(), dcomb.data());
  auto d_dXout = DeviceBuffer::from_host(dXout);
  auto g_Xout = poisoned<uint16_t>(N * D), g_dX = zeroed<float>(N * D), g_dy = zeroed<float>(N * d),
       g_dpost = poisoned<float>(N * n), g_dcomb = poisoned<float>(N * n * n);
  trex::cuda::mhc_expand_fwd_any(n, gs, d_X.as<bf16>(), d_y.as<bf16>(), cga.post, cga.comb,
                                 g_Xout.as<bf16>());
  trex::cuda::mhc_expand_bwd_any(n, gs, d_X.as<bf16>(), d_y.as<bf16>(), cga.post, cga.comb,
                                 d_dXout.as<float>(), g_dX.as<float>(), g_dy.as<float>(), g_dpost.as<float>(),
                                 g_dcomb.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(to_f32(g_Xout.to_host<uint16_t>()), Xout), 1e-2) << what << " Xout";
  EXPECT_LT(rel_err(g_dX.to_host<float>(), dX), 1e-3) << what << " expand dX";
  EXPECT_LT(rel_err(g_dy.to_host<float>(), dy), 1e-3) << what << " expand dy";
  EXPECT_LT(rel_err(g_dpost.to_host<float>(), dpost), 1e-3) << what << " dpost";
  EXPECT_LT(rel_err(g_dcomb.to_host<float>(), dcomb), 1e-3) << what << " dcomb";

  // Site backward (collapse + gates + Sinkhorn + mix projection).
  std::vector<float> sdX(N * D, 0.f), dfn(M * D, 0.f), dbase(M, 0.f), dscale(3, 0.f), scratch(N * M);
  trex::dsv4::mhc_site_bwd(cs, X.values.data(), fn.data(), base.data(), scale.data(), ca, dcol.values.data(),
                           dpost_in.data(), dcomb_in.data(), sdX.data(), dfn.data(), dbase.data(),
                           dscale.data(), scratch.data());
  auto d_dpost = DeviceBuffer::from_host(dpost_in), d_dcomb = DeviceBuffer::from_host(dcomb_in);
  auto s_dX = zeroed<float>(N * D), s_dfn = zeroed<float>(M * D), s_dbase = zeroed<float>(M),
       s_dscale = zeroed<float>(3), s_scr = poisoned<float>(trex::cuda::mhc_site_bwd_scratch_any(n, gs));
  trex::cuda::mhc_site_bwd_any(n, gs, d_X.as<bf16>(), d_fn.as<float>(), d_base.as<float>(),
                               d_scale.as<float>(), cga, d_dcol.as<float>(), d_dpost.as<float>(),
                               d_dcomb.as<float>(), s_dX.as<float>(), s_dfn.as<float>(), s_dbase.as<float>(),
                               s_dscale.as<float>(), s_scr.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(s_dX.to_host<float>(), sdX), 1e-3) << what << " site dX";
  EXPECT_LT(rel_err(s_dfn.to_host<float>(), dfn), 1e-3) << what << " dfn";
  EXPECT_LT(rel_err(s_dbase.to_host<float>(), dbase), 1e-3) << what << " dbase";
  EXPECT_LT(rel_err(s_dscale.to_host<float>(), dscale), 1e-3) << what << " dscale";

  // hc_head forward and backward.
  std::vector<float> hfn = random_f32(n * D, seed + 8, 0.1f), hbase = random_f32(n, seed + 9, 0.5f),
                     hscale = {0.9f};
  std::vector<float> hmix(N * n), hrstd(N), hw(N * n), hy(N * d), hdX(N * D, 0.f), hdfn(n * D, 0.f),
      hdbase(n, 0.f), hdscale(1, 0.f), hscr(N * n);
  trex::dsv4::hc_head_fwd(cs, X.values.data(), hfn.data(), hbase.data(), hscale.data(), hmix.data(),
                          hrstd.data(), hw.data(), hy.data());
  trex::dsv4::hc_head_bwd(cs, X.values.data(), hfn.data(), hbase.data(), hscale.data(), hmix.data(),
                          hrstd.data(), hw.data(), dcol.values.data(), hdX.data(), hdfn.data(), hdbase.data(),
                          hdscale.data(), hscr.data());
  auto d_hfn = DeviceBuffer::from_host(hfn), d_hbase = DeviceBuffer::from_host(hbase),
       d_hscale = DeviceBuffer::from_host(hscale);
  auto g_hmix = poisoned<float>(N * n), g_hrstd = poisoned<float>(N), g_hw = poisoned<float>(N * n),
       g_hy = poisoned<uint16_t>(N * d), g_hdX = zeroed<float>(N * D), g_hdfn = zeroed<float>(n * D),
       g_hdbase = zeroed<float>(n), g_hdscale = zeroed<float>(1),
       g_hscr = poisoned<float>(trex::cuda::hc_head_bwd_scratch_any(n, N));
  trex::cuda::hc_head_fwd_any(n, g_hy.as<bf16>(), g_hmix.as<float>(), g_hrstd.as<float>(), g_hw.as<float>(),
                              d_X.as<bf16>(), d_hfn.as<float>(), d_hbase.as<float>(), d_hscale.as<float>(), N,
                              d, 1e-6f, 1e-6f);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_hmix.to_host<float>(), hmix), 1e-3) << what << " head mix";
  EXPECT_LT(rel_err(g_hw.to_host<float>(), hw), 1e-3) << what << " head w";
  EXPECT_LT(rel_err(to_f32(g_hy.to_host<uint16_t>()), hy), 1e-2) << what << " head y";
  // The backward from the CPU's activations.
  auto c_hmix = DeviceBuffer::from_host(hmix), c_hrstd = DeviceBuffer::from_host(hrstd),
       c_hw = DeviceBuffer::from_host(hw);
  trex::cuda::hc_head_bwd_any(n, g_hdX.as<float>(), g_hdfn.as<float>(), g_hdbase.as<float>(),
                              g_hdscale.as<float>(), d_dcol.as<float>(), d_X.as<bf16>(), d_hfn.as<float>(),
                              d_hbase.as<float>(), d_hscale.as<float>(), c_hmix.as<float>(),
                              c_hrstd.as<float>(), c_hw.as<float>(), N, d, g_hscr.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_hdX.to_host<float>(), hdX), 1e-3) << what << " head dX";
  EXPECT_LT(rel_err(g_hdfn.to_host<float>(), hdfn), 1e-3) << what << " head dfn";
  EXPECT_LT(rel_err(g_hdbase.to_host<float>(), hdbase), 1e-3) << what << " head dbase";
  EXPECT_LT(rel_err(g_hdscale.to_host<float>(), hdscale), 1e-3) << what << " head dscale";
}

TEST(GpuMhcGeneric, TwoAndThreeStreamsMatchCpu) {
  for (int64_t n : {2, 3}) run_mhc(n, 100 + uint32_t(n));
}

// n_hc = 4 through the _any dispatch takes the fast kernels: the same checks hold for them.
TEST(GpuMhcGeneric, FourStreamsViaDispatch) {
  run_mhc(4, 104);
}

}  // namespace
