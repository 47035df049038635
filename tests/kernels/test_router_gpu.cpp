// The CUDA router and token permutation against the router inside trex::dsv4::moe_fwd
// (src/model/dsv4/moe.cpp, compiled into this test as the reference): scores, bias-corrected top-k and hash
// selection, gate weights, the expert-grouped order / offsets; the router backward against central finite
// differences of moe_fwd<double>; gather / combine (and their backward) against loops over the CPU plan.
// Tolerances: scores and weights 1e-6 relative L2 (fp32 vs fp32/fp64 on the same logits); selection, order,
// offsets exact; router backward 1e-4 relative L2 (fp32 vs fp64 differences with step 1e-6); gather exact;
// combine and its backward 1e-2 (bf16 outputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/router.h"
#include "model/dsv4/moe.h"  // the CPU reference (trex_model)

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

namespace {

template <class T>
struct CpuMoe {
  trex::dsv4::MoeShape s;
  std::vector<T> gate, w1, w3, w2, tb;
  std::vector<int32_t> ib;
  trex::dsv4::MoeWeights<T> w;
  trex::dsv4::MoeActs<T> a;
  std::vector<T> out;

  CpuMoe(const trex::dsv4::MoeShape& shape, uint32_t seed) : s(shape) {
    std::mt19937 g(seed);
    std::normal_distribution<double> nd(0.0, 0.5);
    auto fill = [&](std::vector<T>& v, size_t n) {
      v.resize(n);
      for (auto& x : v) x = T(nd(g));
    };
    fill(gate, size_t(s.n_experts * s.d));
    fill(w1, size_t(s.n_experts * s.inter * s.d));
    fill(w3, size_t(s.n_experts * s.inter * s.d));
    fill(w2, size_t(s.n_experts * s.d * s.inter));
    w.gate = gate.data();
    w.w1 = w1.data();
    w.w3 = w3.data();
    w.w2 = w2.data();
    const auto sz = trex::dsv4::moe_act_sizes(s);
    tb.resize(size_t(sz.t_elems));
    ib.resize(size_t(sz.i32_elems));
    a = trex::dsv4::moe_acts_bind(s, tb.data(), ib.data());
    out.resize(size_t(s.n_tok * s.d));
  }
  void run(const std::vector<T>& u, const int32_t* token_ids) {
    trex::dsv4::moe_fwd(s, w, u.data(), token_ids, a, out.data());
  }
};

trex::dsv4::MoeShape moe_shape(int64_t N, int64_t d, int64_t E, int64_t K, bool hash) {
  trex::dsv4::MoeShape s;
  s.n_tok = N;
  s.d = d;
  s.n_experts = E;
  s.topk = K;
  s.inter = 4;
  s.routed_scale = 1.5;
  s.swiglu_limit = 10.0;
  s.hash = hash;
  return s;
}

}  // namespace

TEST(GpuRouter, TopkSelectionWeightsAndPlanMatchMoeForward) {
  for (auto [N, E, K] : {std::tuple<int64_t, int64_t, int64_t>{300, 64, 6}, {1500, 384, 8}, {77, 16, 1}}) {
    const int64_t d = 32;
    CpuMoe<float> cpu(moe_shape(N, d, E, K, false), 51);
    std::vector<float> bias = random_f32(E, 52, 0.1f), u = random_f32(N * d, 53);
    cpu.w.bias = bias.data();
    cpu.run(u, nullptr);
    trex::cuda::RouterShape rs{N, E, K, 1.5, false};
    std::vector<float> logits(cpu.a.logits, cpu.a.logits + N * E);
    auto d_logits = DeviceBuffer::from_host(logits), d_bias = DeviceBuffer::from_host(bias);
    auto g_scores = poisoned<float>(N * E), g_sel = poisoned<int32_t>(N * K), g_w = poisoned<float>(N * K);
    auto g_order = poisoned<int32_t>(N * K), g_pos = poisoned<int32_t>(N * K),
         g_off = poisoned<int32_t>(E + 1);
    DeviceBuffer scratch(size_t(trex::cuda::moe_route_plan_scratch(N, K, E)) * 4);
    trex::cuda::router_fwd(rs, d_logits.as<float>(), d_bias.as<float>(), nullptr, 0, nullptr,
                           g_scores.as<float>(), g_sel.as<int32_t>(), g_w.as<float>(), nullptr);
    trex::cuda::moe_route_plan(g_sel.as<int32_t>(), N, K, E, g_order.as<int32_t>(), g_pos.as<int32_t>(),
                               g_off.as<int32_t>(), scratch.as<int32_t>());
    TREX_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(rel_err(g_scores.to_host<float>(), std::vector<float>(cpu.a.scores, cpu.a.scores + N * E)),
              1e-6);
    EXPECT_EQ(g_sel.to_host<int32_t>(), std::vector<int32_t>(cpu.a.sel, cpu.a.sel + N * K)) << "E=" << E;
    EXPECT_LT(rel_err(g_w.to_host<float>(), std::vector<float>(cpu.a.weight, cpu.a.weight + N * K)), 1e-6);
    const auto order = g_order.to_host<int32_t>(), pos = g_pos.to_host<int32_t>();
    EXPECT_EQ(order, std::vector<int32_t>(cpu.a.order, cpu.a.order + N * K));
    EXPECT_EQ(g_off.to_host<int32_t>(), std::vector<int32_t>(cpu.a.offsets, cpu.a.offsets + E + 1));
    for (int64_t p = 0; p < N * K; ++p)
      ASSERT_EQ(pos[size_t(order[size_t(p)])], p) << "slot_pos is not the inverse";
  }
}

TEST(GpuRouter, HashSelectionMatchesMoeForwardAndFlagsBadIds) {
  const int64_t N = 200, d = 16, E = 32, K = 6, vocab = 50;
  CpuMoe<float> cpu(moe_shape(N, d, E, K, true), 61);
  std::vector<int32_t> tid2eid(vocab * K), ids(N);
  std::mt19937 g(62);
  for (auto& x : tid2eid) x = int32_t(g() % E);
  for (auto& x : ids) x = int32_t(g() % vocab);
  cpu.w.tid2eid = tid2eid.data();
  cpu.w.vocab = vocab;
  std::vector<float> u = random_f32(N * d, 63);
  cpu.run(u, ids.data());
  trex::cuda::RouterShape rs{N, E, K, 1.5, true};
  auto d_logits = DeviceBuffer::from_host(std::vector<float>(cpu.a.logits, cpu.a.logits + N * E));
  auto d_t = DeviceBuffer::from_host(tid2eid), d_ids = DeviceBuffer::from_host(ids);
  auto g_scores = poisoned<float>(N * E), g_sel = poisoned<int32_t>(N * K), g_w = poisoned<float>(N * K);
  auto status = zeroed<int32_t>(1);
  trex::cuda::router_fwd(rs, d_logits.as<float>(), nullptr, d_t.as<int32_t>(), vocab, d_ids.as<int32_t>(),
                         g_scores.as<float>(), g_sel.as<int32_t>(), g_w.as<float>(), status.as<int32_t>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(g_sel.to_host<int32_t>(), std::vector<int32_t>(cpu.a.sel, cpu.a.sel + N * K));
  EXPECT_LT(rel_err(g_w.to_host<float>(), std::vector<float>(cpu.a.weight, cpu.a.weight + N * K)), 1e-6);
  EXPECT_EQ(status.to_host<int32_t>()[0], 0);
  ids[17] = int32_t(vocab);  // out of range
  auto d_bad = DeviceBuffer::from_host(ids);
  trex::cuda::router_fwd(rs, d_logits.as<float>(), nullptr, d_t.as<int32_t>(), vocab, d_bad.as<int32_t>(),
                         g_scores.as<float>(), g_sel.as<int32_t>(), g_w.as<float>(), status.as<int32_t>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(status.to_host<int32_t>()[0], 1);
}

TEST(GpuRouter, BackwardMatchesFiniteDifferencesOfMoeForward) {
  // d = E and gate = I make the router logits equal to u, so moe_fwd<double> can be differentiated in them.
  const int64_t N = 12, E = 20, K = 4;
  CpuMoe<double> cpu(moe_shape(N, E, E, K, false), 71);
  std::fill(cpu.gate.begin(), cpu.gate.end(), 0.0);
  for (int64_t e = 0; e < E; ++e) cpu.gate[size_t(e * E + e)] = 1.0;
  std::vector<float> bias = random_f32(E, 72, 0.1f), cw = random_f32(N * K, 73), cs = random_f32(N * E, 74);
  cpu.w.bias = bias.data();
  std::vector<double> z(N * E);
  auto zf = random_f32(N * E, 75, 2.0f);
  for (size_t i = 0; i < z.size(); ++i) z[i] = zf[i];
  auto loss = [&](const std::vector<double>& zz) {
    cpu.run(zz, nullptr);
    double L = 0;
    for (int64_t i = 0; i < N * K; ++i) L += double(cw[size_t(i)]) * cpu.a.weight[i];
    for (int64_t i = 0; i < N * E; ++i) L += double(cs[size_t(i)]) * cpu.a.scores[i];
    return L;
  };
  std::vector<float> fd(N * E);
  const double h = 1e-6;
  for (int64_t i = 0; i < N * E; ++i) {
    auto zp = z, zm = z;
    zp[size_t(i)] += h;
    zm[size_t(i)] -= h;
    fd[size_t(i)] = float((loss(zp) - loss(zm)) / (2 * h));
  }
  std::vector<float> logits(zf);
  trex::cuda::RouterShape rs{N, E, K, 1.5, false};
  auto d_logits = DeviceBuffer::from_host(logits), d_bias = DeviceBuffer::from_host(bias),
       d_cw = DeviceBuffer::from_host(cw), d_cs = DeviceBuffer::from_host(cs);
  auto g_scores = poisoned<float>(N * E), g_sel = poisoned<int32_t>(N * K), g_w = poisoned<float>(N * K),
       g_dl = poisoned<float>(N * E);
  trex::cuda::router_fwd(rs, d_logits.as<float>(), d_bias.as<float>(), nullptr, 0, nullptr,
                         g_scores.as<float>(), g_sel.as<int32_t>(), g_w.as<float>(), nullptr);
  trex::cuda::router_bwd(rs, d_logits.as<float>(), g_scores.as<float>(), g_sel.as<int32_t>(),
                         d_cw.as<float>(), d_cs.as<float>(), g_dl.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_dl.to_host<float>(), fd), 1e-4);
}

TEST(GpuRouter, GatherCombineAndBackwardFollowThePlan) {
  const int64_t N = 90, E = 12, K = 3, d = 64;
  CpuMoe<float> cpu(moe_shape(N, 8, E, K, false), 81);
  std::vector<float> u8 = random_f32(N * 8, 82);
  cpu.run(u8, nullptr);
  std::vector<int32_t> order(cpu.a.order, cpu.a.order + N * K), pos(N * K);
  for (int64_t p = 0; p < N * K; ++p) pos[size_t(order[size_t(p)])] = int32_t(p);
  std::vector<float> weight(cpu.a.weight, cpu.a.weight + N * K);
  auto u = random_bf16(N * d, 83), ye = random_bf16(N * K * d, 84), add = random_bf16(N * d, 85),
       dout = random_bf16(N * d, 86), dxe = random_bf16(N * K * d, 87);
  std::vector<float> xe_ref(N * K * d), out_ref(N * d), du_ref(N * d, 0.f), dye_ref(N * K * d), dw_ref(N * K);
  for (int64_t p = 0; p < N * K; ++p)
    for (int64_t j = 0; j < d; ++j)
      xe_ref[size_t(p * d + j)] = u.values[size_t((order[size_t(p)] / K) * d + j)];
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < d; ++j) {
      float acc = add.values[size_t(t * d + j)], g = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t p = pos[size_t(t * K + k)];
        acc += weight[size_t(t * K + k)] * ye.values[size_t(p * d + j)];
        g += dxe.values[size_t(p * d + j)];
        dye_ref[size_t(p * d + j)] = weight[size_t(t * K + k)] * dout.values[size_t(t * d + j)];
        dw_ref[size_t(t * K + k)] += dout.values[size_t(t * d + j)] * ye.values[size_t(p * d + j)];
      }
      out_ref[size_t(t * d + j)] = acc;
      du_ref[size_t(t * d + j)] = g;
    }
  auto d_u = DeviceBuffer::from_host(u.bits), d_ye = DeviceBuffer::from_host(ye.bits),
       d_add = DeviceBuffer::from_host(add.bits), d_dout = DeviceBuffer::from_host(dout.bits),
       d_dxe = DeviceBuffer::from_host(dxe.bits), d_order = DeviceBuffer::from_host(order),
       d_pos = DeviceBuffer::from_host(pos), d_w = DeviceBuffer::from_host(weight);
  auto g_xe = poisoned<uint16_t>(N * K * d), g_out = poisoned<uint16_t>(N * d),
       g_dye = poisoned<uint16_t>(N * K * d), g_dw = poisoned<float>(N * K);
  auto g_du = zeroed<float>(N * d);
  trex::cuda::moe_gather(g_xe.as<bf16>(), d_u.as<bf16>(), d_order.as<int32_t>(), N, K, d);
  trex::cuda::moe_combine(g_out.as<bf16>(), d_ye.as<bf16>(), d_pos.as<int32_t>(), d_w.as<float>(),
                          d_add.as<bf16>(), N, K, d);
  // The fp32 combine of partial outputs (expert tensor parallelism) accumulates onto what is there: start it from
  // the shared term, and it must give the bf16 combine's sum unrounded.
  auto g_acc = DeviceBuffer::from_host(add.values);
  trex::cuda::moe_combine_accumulate(g_acc.as<float>(), d_ye.as<bf16>(), d_pos.as<int32_t>(), d_w.as<float>(), N, K,
                                     d);
  trex::cuda::moe_gather_bwd(g_du.as<float>(), d_dxe.as<bf16>(), d_pos.as<int32_t>(), N, K, d);
  trex::cuda::moe_combine_bwd(g_dye.as<bf16>(), g_dw.as<float>(), d_dout.as<bf16>(), d_ye.as<bf16>(),
                              d_pos.as<int32_t>(), d_w.as<float>(), N, K, d);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(rel_err(to_f32(g_xe.to_host<uint16_t>()), xe_ref), 0.0);
  EXPECT_LT(rel_err(to_f32(g_out.to_host<uint16_t>()), out_ref), 1e-2);
  EXPECT_LT(rel_err(g_acc.to_host<float>(), out_ref), 1e-6);
  EXPECT_LT(rel_err(g_du.to_host<float>(), du_ref), 1e-6);
  EXPECT_LT(rel_err(to_f32(g_dye.to_host<uint16_t>()), dye_ref), 1e-2);
  EXPECT_LT(rel_err(g_dw.to_host<float>(), dw_ref), 1e-5);
}

namespace {
TEST(GpuRouter, RowsGatherAndScatterPermuteWholeRows) {
  const int64_t n = 77, d = 48;
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), std::mt19937(91));
  auto src = random_bf16(n * d, 92);
  auto d_src = DeviceBuffer::from_host(src.bits), d_idx = DeviceBuffer::from_host(idx);
  auto g = poisoned<uint16_t>(n * d), s = poisoned<uint16_t>(n * d);
  trex::cuda::rows_gather(g.as<bf16>(), d_src.as<bf16>(), d_idx.as<int32_t>(), n, d);
  trex::cuda::rows_scatter(s.as<bf16>(), d_src.as<bf16>(), d_idx.as<int32_t>(), n, d);
  TREX_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> hg = g.to_host<uint16_t>(), hs = s.to_host<uint16_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      const size_t from = size_t(idx[size_t(i)] * d + j), to = size_t(i * d + j);
      ASSERT_EQ(hg[to], src.bits[from]) << "gather row " << i;
      ASSERT_EQ(hs[from], src.bits[to]) << "scatter row " << i;
    }
}

TEST(GpuRouter, ExpertCountsAreTheOffsetsDifferences) {
  // 300 experts: more than one block of the kernel; some experts empty (the poison, -1, would show).
  const int64_t E = 300;
  std::mt19937 g(17);
  std::vector<int32_t> off(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) off[size_t(e + 1)] = off[size_t(e)] + int32_t(g() % 4 == 0 ? 0 : g() % 50);
  auto d_off = DeviceBuffer::from_host(off);
  auto counts = poisoned<int32_t>(E);
  trex::cuda::moe_expert_counts(d_off.as<int32_t>(), E, counts.as<int32_t>());
  TREX_CUDA(cudaDeviceSynchronize());
  const std::vector<int32_t> h = counts.to_host<int32_t>();
  for (int64_t e = 0; e < E; ++e) ASSERT_EQ(h[size_t(e)], off[size_t(e + 1)] - off[size_t(e)]) << "expert " << e;
}
}  // namespace
