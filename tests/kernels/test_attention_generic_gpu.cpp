// The generic CUDA sparse attention (attention_generic.h: any head dim / head count, the fallback for shapes
// the fast kernels do not serve) against trex::cpu::sparse_attention_* in fp32 on the same bf16-rounded
// inputs: the golden fixtures' head dims 16 / 32 / 48 (and an odd 40 with 3 heads), sliding window in packed
// documents, CSA selections with empty (-1) slots, HCA ranges. Tolerances (relative L2) as the fast kernel's
// test: o, dq 1e-2 (bf16 outputs); lse 1e-5 (fp32); dkv, dcmp, dsink 1e-2 (fp32 sums; the backward
// reference reads o rounded to bf16, as the GPU keeps it).
#include <gtest/gtest.h>

#include <algorithm>

#include "gpu_test_util.h"
#include "kernels/cpu/attention_sparse.h"
#include "kernels/cuda/attention_generic.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

namespace {

struct GenericCase {
  int64_t N, H, c, E, window, k_sel;
  bool csa;
  uint32_t seed;
};

void run_generic(const GenericCase& cs) {
  const int64_t N = cs.N, H = cs.H, c = cs.c, E = cs.E;
  std::mt19937 g(cs.seed);
  const int64_t doc2 = N / 2 + 3;
  std::vector<int64_t> win_begin(N), cmp_begin(N), cmp_end(N), sel;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t doc_start = i < doc2 ? 0 : doc2;
    win_begin[i] = std::max(doc_start, i - cs.window + 1);
    const int64_t e0 = i < doc2 ? 0 : E / 2;
    cmp_begin[i] = e0;
    cmp_end[i] = std::min<int64_t>(e0 + (i - doc_start + 1) / 4, i < doc2 ? E / 2 : E);
  }
  if (cs.csa) {
    sel.resize(size_t(N * cs.k_sel));
    std::uniform_int_distribution<int64_t> ent(0, E - 1);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (auto& s : sel) s = u(g) < 0.2f ? -1 : ent(g);
  }
  auto q = random_bf16(N * H * c, cs.seed + 1), kv = random_bf16(N * c, cs.seed + 2),
       cmp = random_bf16(E * c, cs.seed + 3), dout = random_bf16(N * H * c, cs.seed + 4);
  std::vector<float> sink = random_f32(H, cs.seed + 5);

  trex::cpu::SparseKeySets ck;
  ck.win_begin = win_begin.data();
  if (cs.csa) {
    ck.cmp_sel = sel.data();
    ck.k_sel = cs.k_sel;
  } else {
    ck.cmp_begin = cmp_begin.data();
    ck.cmp_end = cmp_end.data();
  }
  std::vector<float> o(N * H * c), lse(N * H), dq(N * H * c), dkv(N * c, 0.f), dcmp(E * c, 0.f),
      dsink(H, 0.f);
  trex::cpu::sparse_attention_fwd(q.values.data(), kv.values.data(), cmp.values.data(), sink.data(), N, H, c,
                                  ck, o.data(), lse.data());
  // The backward reference reads o rounded to bf16, as the GPU keeps it: D = dO . O enters dsink as a sum over
  // all queries with heavy cancellation (random dO), so the rounding of O alone would move a 2-head dsink by ~3%.
  std::vector<float> o_b(o.size());
  for (size_t k = 0; k < o.size(); ++k) o_b[k] = trex::bf16_to_f32(trex::f32_to_bf16(o[k]));
  trex::cpu::sparse_attention_bwd(q.values.data(), kv.values.data(), cmp.values.data(), sink.data(), N, E, H,
                                  c, ck, o_b.data(), lse.data(), dout.values.data(), dq.data(), dkv.data(),
                                  dcmp.data(), dsink.data());

  auto d_q = DeviceBuffer::from_host(q.bits), d_kv = DeviceBuffer::from_host(kv.bits),
       d_cmp = DeviceBuffer::from_host(cmp.bits), d_do = DeviceBuffer::from_host(dout.bits),
       d_sink = DeviceBuffer::from_host(sink), d_wb = DeviceBuffer::from_host(win_begin),
       d_cb = DeviceBuffer::from_host(cmp_begin), d_ce = DeviceBuffer::from_host(cmp_end);
  DeviceBuffer d_sel = cs.csa ? DeviceBuffer::from_host(sel) : DeviceBuffer();
  trex::cuda::SparseKeySets gk;
  gk.win_begin = d_wb.as<int64_t>();
  gk.max_win = cs.window;
  if (cs.csa) {
    gk.cmp_sel = d_sel.as<int64_t>();
    gk.k_sel = cs.k_sel;
  } else {
    gk.cmp_begin = d_cb.as<int64_t>();
    gk.cmp_end = d_ce.as<int64_t>();
  }
  auto g_o = poisoned<uint16_t>(N * H * c), g_lse = poisoned<float>(N * H),
       g_dq = poisoned<uint16_t>(N * H * c);
  auto g_dkv = zeroed<float>(N * c), g_dcmp = zeroed<float>(E * c), g_dsink = zeroed<float>(H);
  auto scratch = poisoned<float>(trex::cuda::sparse_attention_generic_bwd_scratch(N, E, H, c, gk));
  trex::cuda::sparse_attention_generic_fwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(),
                                           d_sink.as<float>(), N, H, c, gk, g_o.as<bf16>(),
                                           g_lse.as<float>());
  trex::cuda::sparse_attention_generic_bwd(
      d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N, E, H, c, gk, g_o.as<bf16>(),
      g_lse.as<float>(), d_do.as<bf16>(), g_dq.as<bf16>(), g_dkv.as<float>(), g_dcmp.as<float>(),
      g_dsink.as<float>(), scratch.as<float>());
  TREX_CUDA(cudaDeviceSynchronize());
  const std::string what =
      std::string(cs.csa ? "CSA" : "HCA") + " generic c=" + std::to_string(c) + " H=" + std::to_string(H);
  const double e_o = rel_err(to_f32(g_o.to_host<uint16_t>()), o),
               e_lse = rel_err(g_lse.to_host<float>(), lse),
               e_dq = rel_err(to_f32(g_dq.to_host<uint16_t>()), dq),
               e_dkv = rel_err(g_dkv.to_host<float>(), dkv), e_dcmp = rel_err(g_dcmp.to_host<float>(), dcmp),
               e_dsink = rel_err(g_dsink.to_host<float>(), dsink);
  std::printf("%s: rel L2 o %.2e lse %.2e dq %.2e dkv %.2e dcmp %.2e dsink %.2e\n", what.c_str(), e_o, e_lse,
              e_dq, e_dkv, e_dcmp, e_dsink);
  EXPECT_LT(e_o, 1e-2) << what;
  EXPECT_LT(e_lse, 1e-5) << what;
  EXPECT_LT(e_dq, 1e-2) << what;
  EXPECT_LT(e_dkv, 1e-2) << what;
  EXPECT_LT(e_dcmp, 1e-2) << what;
  EXPECT_LT(e_dsink, 1e-2) << what;
}

TEST(GpuAttentionGeneric, FixtureHeadDimsCsaAndHca) {
  for (const GenericCase& cs :
       {GenericCase{160, 4, 32, 40, 16, 8, true, 1}, GenericCase{160, 4, 32, 10, 16, 0, false, 2},
        GenericCase{200, 2, 48, 50, 24, 6, true, 3}, GenericCase{97, 4, 16, 12, 8, 0, false, 4},
        GenericCase{97, 4, 16, 24, 8, 5, true, 5}, GenericCase{70, 3, 40, 20, 9, 4, true, 6}})
    run_generic(cs);
}

TEST(GpuAttentionGeneric, FastHeadDimsAreTheOnlyOnesRoutedAway) {
  EXPECT_TRUE(trex::cuda::sparse_attention_fast_head_dim(256));
  EXPECT_TRUE(trex::cuda::sparse_attention_fast_head_dim(512));
  for (int64_t c : {16, 32, 48, 64, 128}) EXPECT_FALSE(trex::cuda::sparse_attention_fast_head_dim(c)) << c;
}

}  // namespace
