// `trex bench ops`: every CUDA kernel family (sparse attention, mHC, router + permutation, fused LM head +
// CE) at a model config's shapes for one GPU's T tokens (one packed sequence), on device-filled random data.
// Each line reports the median time of `reps` event-timed runs after two warm-ups, the work done, and the
// achieved rate against the H200 ceilings of docs/performance.md (4,162 GB/s copy, 770 TFLOP/s bf16 GEMM; the
// attention kernels run on CUDA cores, whose fp32 FMA peak is ~67 TFLOP/s).
#include "bench_ops.h"

#include <fmt/format.h>

#include <cstdio>

#include "core/error.h"
#include "core/files.h"
#ifdef TREX_HAVE_CUDA
#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/lm_head_ce.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/router.h"
#endif

namespace trex::bench {

#ifdef TREX_HAVE_CUDA
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

constexpr double kCopyGBs = 4162, kGemmTflops = 770;

double median_ms(int reps, const std::function<void()>& f) {
  for (int i = 0; i < 2; ++i) f();
  TREX_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms(static_cast<size_t>(reps));
  cudaEvent_t a, b;
  TREX_CUDA(cudaEventCreate(&a));
  TREX_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    TREX_CUDA(cudaEventRecord(a));
    f();
    TREX_CUDA(cudaEventRecord(b));
    TREX_CUDA(cudaEventSynchronize(b));
    TREX_CUDA(cudaEventElapsedTime(&ms[size_t(i)], a, b));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

DeviceBuffer rand_bf16(int64_t n, uint64_t seed, float scale = 1.f) {
  DeviceBuffer b(size_t(n) * 2);
  cuda::fill_uniform_bf16(b.as<bf16>(), n, seed, scale);
  return b;
}
DeviceBuffer rand_f32(int64_t n, uint64_t seed, float scale = 1.f) {
  DeviceBuffer b(size_t(n) * 4);
  cuda::fill_uniform_f32(b.as<float>(), n, seed, scale);
  return b;
}
DeviceBuffer zeros(size_t bytes) {
  DeviceBuffer b(bytes);
  TREX_CUDA(cudaMemset(b.as(), 0, bytes));
  return b;
}

void report_bytes(const std::string& name, double ms, double bytes) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf(
      "%s\n",
      fmt::format(R"({{"op": "{}", "ms": {:.4f}, "GB": {:.3f}, "GB/s": {:.0f}, "of_copy_ceiling": {:.2f}}})",
                  name, ms, bytes / 1e9, gbs, gbs / kCopyGBs)
          .c_str());
}
void report_flops(const std::string& name, double ms, double flop, double ceiling_tflops) {
  const double tf = flop / (ms * 1e-3) / 1e12;
  std::printf(
      "%s\n",
      fmt::format(
          R"({{"op": "{}", "ms": {:.4f}, "GFLOP": {:.1f}, "TFLOP/s": {:.1f}, "of_ceiling": {:.2f}, "ceiling_TFLOP/s": {:.0f}}})",
          name, ms, flop / 1e9, tf, tf / ceiling_tflops, ceiling_tflops)
          .c_str());
}

void bench_attention(const json& cfg, int64_t T, int reps) {
  const int64_t H = cfg.at("num_attention_heads"), c = cfg.at("head_dim"), W = cfg.at("sliding_window"),
                topk = cfg.at("index_topk");
  auto q = rand_bf16(T * H * c, 1), kv = rand_bf16(T * c, 2), dout = rand_bf16(T * H * c, 3);
  auto sink = rand_f32(H, 4);
  DeviceBuffer o(size_t(T * H * c) * 2), lse(size_t(T * H) * 4), dq(size_t(T * H * c) * 2);
  auto dkv = zeros(size_t(T * c) * 4), dsink = zeros(size_t(H) * 4);
  std::vector<int64_t> wb(static_cast<size_t>(T)), cb(static_cast<size_t>(T), 0), ce(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) wb[size_t(t)] = std::max<int64_t>(0, t - W + 1);
  auto d_wb = DeviceBuffer::from_host(wb);
  struct Variant {
    const char* name;
    int64_t ratio;  // 0 = window only, 4 = CSA (top-k), 128 = HCA (all visible)
  };
  for (const Variant& v : {Variant{"SWA", 0}, Variant{"CSA", 4}, Variant{"HCA", 128}}) {
    cuda::SparseKeySets keys;
    keys.win_begin = d_wb.as<int64_t>();
    keys.max_win = W;
    int64_t E = v.ratio ? T / v.ratio : 0;
    double n_keys = 0;
    for (int64_t t = 0; t < T; ++t) n_keys += double(t - wb[size_t(t)] + 1);
    DeviceBuffer d_sel, d_cb, d_ce;
    if (v.ratio == 4) {
      std::vector<int64_t> sel(static_cast<size_t>(T * topk));
      uint64_t st = 12345;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t nv = (t + 1) / 4;
        for (int64_t s = 0; s < topk; ++s) {
          st = st * 6364136223846793005ull + 1442695040888963407ull;
          sel[size_t(t * topk + s)] = s < nv ? int64_t((st >> 33) % uint64_t(nv)) : -1;
          n_keys += s < nv ? 1 : 0;
        }
      }
      d_sel = DeviceBuffer::from_host(sel);
      keys.cmp_sel = d_sel.as<int64_t>();
      keys.k_sel = topk;
    } else if (v.ratio == 128) {
      for (int64_t t = 0; t < T; ++t) {
        ce[size_t(t)] = (t + 1) / 128;
        n_keys += double(ce[size_t(t)]);
      }
      d_cb = DeviceBuffer::from_host(cb);
      d_ce = DeviceBuffer::from_host(ce);
      keys.cmp_begin = d_cb.as<int64_t>();
      keys.cmp_end = d_ce.as<int64_t>();
    }
    auto cmp = rand_bf16(std::max<int64_t>(E, 1) * c, 5);
    auto dcmp = zeros(size_t(std::max<int64_t>(E, 1) * c) * 4);
    DeviceBuffer scratch(size_t(cuda::sparse_attention_bwd_scratch(T, E, H, c, keys)) * 4);  // per key kind
    const double fwd_flop = 4.0 * double(H) * double(c) * n_keys;  // q.k and p.v
    double ms = median_ms(reps, [&] {
      cuda::sparse_attention_fwd(q.as<bf16>(), kv.as<bf16>(), cmp.as<bf16>(), sink.as<float>(), T, H, c, keys,
                                 o.as<bf16>(), lse.as<float>());
    });
    report_flops(
        fmt::format("attention {} fwd (T={}, H={}, c={}, keys/query={:.0f})", v.name, T, H, c, n_keys / T),
        ms, fwd_flop, 67);
    ms = median_ms(reps, [&] {
      cuda::sparse_attention_bwd(q.as<bf16>(), kv.as<bf16>(), cmp.as<bf16>(), sink.as<float>(), T, E, H, c,
                                 keys, o.as<bf16>(), lse.as<float>(), dout.as<bf16>(), dq.as<bf16>(),
                                 dkv.as<float>(), dcmp.as<float>(), dsink.as<float>(), scratch.as<float>());
    });
    report_flops(fmt::format("attention {} bwd", v.name), ms, 2.5 * fwd_flop, 67);  // s, dp, dq, dk, dv
  }
}

void bench_mhc(const json& cfg, int64_t T, int reps) {
  const int64_t d = cfg.at("hidden_size"), D = 4 * d;
  cuda::MhcDims s;
  s.n_tok = T;
  s.d = d;
  s.sinkhorn_iters = cfg.value("hc_sinkhorn_iters", 20);
  auto X = rand_bf16(T * D, 11), y = rand_bf16(T * d, 12);
  auto dcol = rand_f32(T * d, 13);
  auto fn = rand_f32(24 * D, 14, 0.02f), base = rand_f32(24, 15), scale = rand_f32(3, 16);
  auto dXout = rand_f32(T * D, 17);
  DeviceBuffer mix(size_t(T) * 24 * 4), rstd(size_t(T) * 4), pre(size_t(T) * 16), post(size_t(T) * 16),
      comb(size_t(T) * 64), col(size_t(T * d) * 2), Xout(size_t(T * D) * 2), dpost(size_t(T) * 16),
      dcomb(size_t(T) * 64), scratch(size_t(cuda::mhc_site_bwd_scratch(s)) * 4);
  auto dX = zeros(size_t(T * D) * 4), dy = zeros(size_t(T * d) * 4), dfn = zeros(size_t(24 * D) * 4),
       dbase = zeros(24 * 4), dscale = zeros(3 * 4);
  cuda::MhcActs a{mix.as<float>(), rstd.as<float>(), pre.as<float>(), post.as<float>(), comb.as<float>()};
  double ms = median_ms(reps, [&] {
    cuda::mhc_site_fwd(s, X.as<bf16>(), fn.as<float>(), base.as<float>(), scale.as<float>(), a,
                       col.as<bf16>());
  });
  report_bytes(fmt::format("mhc site fwd (T={}, d={})", T, d), ms, double(T) * (D * 2 + d * 2 + 24 * 4));
  ms = median_ms(reps, [&] {
    cuda::mhc_expand_fwd(s, X.as<bf16>(), y.as<bf16>(), post.as<float>(), comb.as<float>(), Xout.as<bf16>());
  });
  report_bytes("mhc expand fwd", ms, double(T) * (D * 2 + d * 2 + D * 2));
  ms = median_ms(reps, [&] {
    cuda::mhc_expand_bwd(s, X.as<bf16>(), y.as<bf16>(), post.as<float>(), comb.as<float>(), dXout.as<float>(),
                         dX.as<float>(), dy.as<float>(), dpost.as<float>(), dcomb.as<float>());
  });
  // reads X, y, dXout; read-modify-writes dX, dy
  report_bytes("mhc expand bwd", ms, double(T) * (D * 2 + d * 2 + D * 4 + 2 * D * 4 + 2 * d * 4));
  ms = median_ms(reps, [&] {
    cuda::mhc_site_bwd(s, X.as<bf16>(), fn.as<float>(), base.as<float>(), scale.as<float>(), a,
                       dcol.as<float>(), dpost.as<float>(), dcomb.as<float>(), dX.as<float>(), dfn.as<float>(),
                       dbase.as<float>(), dscale.as<float>(), scratch.as<float>());
  });
  // reads X twice (dX pass and dfn pass), dcollapsed, read-modify-writes dX
  report_bytes("mhc site bwd", ms, double(T) * (2 * D * 2 + d * 4 + 2 * D * 4));
}

void bench_router(const json& cfg, int64_t T, int reps) {
  const int64_t E = cfg.at("n_routed_experts"), K = cfg.at("num_experts_per_tok"), d = cfg.at("hidden_size");
  cuda::RouterShape rs{T, E, K, cfg.value("routed_scaling_factor", 1.0), false};
  auto logits = rand_f32(T * E, 21, 3.f), bias = rand_f32(E, 22, 0.1f), dweight = rand_f32(T * K, 23);
  auto u = rand_bf16(T * d, 24), ye = rand_bf16(T * K * d, 25);
  DeviceBuffer scores(size_t(T * E) * 4), sel(size_t(T * K) * 4), weight(size_t(T * K) * 4),
      order(size_t(T * K) * 4), pos(size_t(T * K) * 4), offsets(size_t(E + 1) * 4),
      scratch(size_t(cuda::moe_route_plan_scratch(T, K, E)) * 4), dlogits(size_t(T * E) * 4),
      xe(size_t(T * K * d) * 2), out(size_t(T * d) * 2);
  double ms = median_ms(reps, [&] {
    cuda::router_fwd(rs, logits.as<float>(), bias.as<float>(), nullptr, 0, nullptr, scores.as<float>(),
                     sel.as<int32_t>(), weight.as<float>(), nullptr);
  });
  report_bytes(fmt::format("router fwd (T={}, E={}, K={})", T, E, K), ms,
               double(T) * (2 * E * 4 + 2 * K * 4));
  ms = median_ms(reps, [&] {
    cuda::moe_route_plan(sel.as<int32_t>(), T, K, E, order.as<int32_t>(), pos.as<int32_t>(),
                         offsets.as<int32_t>(), scratch.as<int32_t>());
  });
  report_bytes("moe route plan (counts, offsets, order)", ms, double(T) * K * 4 * 4);
  ms = median_ms(reps, [&] {
    cuda::router_bwd(rs, logits.as<float>(), scores.as<float>(), sel.as<int32_t>(), dweight.as<float>(),
                     nullptr, dlogits.as<float>());
  });
  report_bytes("router bwd", ms, double(T) * (3 * E * 4 + 2 * K * 4));
  ms = median_ms(reps, [&] { cuda::moe_gather(xe.as<bf16>(), u.as<bf16>(), order.as<int32_t>(), T, K, d); });
  report_bytes(fmt::format("moe gather (d={})", d), ms, double(T) * K * d * 2 * 2);
  ms = median_ms(reps, [&] {
    cuda::moe_combine(out.as<bf16>(), ye.as<bf16>(), pos.as<int32_t>(), weight.as<float>(), u.as<bf16>(), T,
                      K, d);
  });
  report_bytes("moe combine (+ shared)", ms, double(T) * (K * d * 2 + 2 * d * 2));
}

void bench_ce(const json& cfg, int64_t T, int reps) {
  const int64_t d = cfg.at("hidden_size"), V = cfg.at("vocab_size");
  cuda::LmHeadCeShape s{T, d, V, 8192};
  auto h = rand_bf16(T * d, 31), w = rand_bf16(V * d, 32, 0.05f);
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) tg[size_t(i)] = int32_t((i * 7919) % V);
  auto targets = DeviceBuffer::from_host(tg);
  DeviceBuffer scratch(cuda::lm_head_ce_scratch_bytes(s)), lse(size_t(T) * 4), loss(size_t(T) * 4), sum(4);
  auto dh = zeros(size_t(T * d) * 4), dw = zeros(size_t(V * d) * 4);
  cuda::Gemm gemm;
  double ms = median_ms(reps, [&] {
    cuda::lm_head_ce_fwd(gemm, s, h.as<bf16>(), w.as<bf16>(), targets.as<int32_t>(), lse.as<float>(),
                         loss.as<float>(), sum.as<float>(), scratch.as());
  });
  const double flop = 2.0 * double(T) * double(V) * double(d);
  report_flops(fmt::format("lm head + CE fwd (T={}, d={}, V={}, chunk={})", T, d, V, s.chunk), ms, flop,
               kGemmTflops);
  ms = median_ms(reps, [&] {
    cuda::lm_head_ce_bwd(gemm, s, h.as<bf16>(), w.as<bf16>(), targets.as<int32_t>(), lse.as<float>(), 1.f / T,
                         dh.as<float>(), dw.as<float>(), scratch.as());
  });
  report_flops("lm head + CE bwd (recompute + dX + dW)", ms, 3 * flop, kGemmTflops);
}

}  // namespace
#endif

void bench_ops(const std::string& config, int64_t tokens, int reps) {
#ifndef TREX_HAVE_CUDA
  trex::fail("trex bench ops needs a build with CUDA (TREX_CUDA=ON) and a GPU");
#else
  TREX_CHECK(tokens > 0 && reps > 0, "trex bench ops: --tokens and --reps must be positive");
  const json cfg = read_json_file(config);
  bench_mhc(cfg, tokens, reps);
  bench_router(cfg, tokens, reps);
  bench_ce(cfg, tokens, reps);
  bench_attention(cfg, tokens, reps);
#endif
}

}  // namespace trex::bench
