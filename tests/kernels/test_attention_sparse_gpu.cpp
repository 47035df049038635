// The CUDA sparse attention (forward and backward), both implementations (tensor cores, the default, and the
// fp32 CUDA-core kernels), against trex::cpu::sparse_attention_* in fp32 on the same bf16-rounded inputs:
// packed documents, a sliding window, CSA selections with empty (-1) slots, HCA ranges, head counts that are
// not a multiple of the heads a block serves (16 for CUDA cores; 16, 32 or 64 for tensor cores), V4's
// c = 512 x 64 heads, small-s6's 16 heads, and key counts that are not a multiple of the 32- or 64-key tiles (every
// forward and backward tiling of the tensor-core kernel is checked, including the split-dims kernels).
// Tolerances (relative L2): o, dq 1e-2 (bf16 outputs: 2^-9 rounding, fp32 sums in another order);
// lse 1e-5 (fp32); dkv, dcmp, dsink 1e-2 (fp32 sums over bf16 o, whose rounding enters D = dO . O).
#include <gtest/gtest.h>

#include <algorithm>

#include "gpu_test_util.h"
#include "kernels/cpu/attention_sparse.h"
#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/attention_sparse_mma.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

namespace {

struct Case {
  int64_t N, H, c, E, window, k_sel;
  bool csa;  // selected entries (else dense HCA ranges)
  uint32_t seed;
};

using trex::cuda::SparseAttnKernel;

void run_case(const Case& cs, SparseAttnKernel kernel) {
  const int64_t N = cs.N, H = cs.H, c = cs.c, E = cs.E;
  std::mt19937 g(cs.seed);
  // Two packed documents; the window stays inside its document.
  const int64_t doc2 = N / 2 + 3;
  std::vector<int64_t> win_begin(N), cmp_begin(N), cmp_end(N), sel;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t doc_start = i < doc2 ? 0 : doc2;
    win_begin[i] = std::max(doc_start, i - cs.window + 1);
    // HCA-like: entries of the document seen so far (first half of the entries belong to document 1).
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
  trex::cpu::sparse_attention_bwd(q.values.data(), kv.values.data(), cmp.values.data(), sink.data(), N, E, H,
                                  c, ck, o.data(), lse.data(), dout.values.data(), dq.data(), dkv.data(),
                                  dcmp.data(), dsink.data());

  auto d_q = DeviceBuffer::from_host(q.bits), d_kv = DeviceBuffer::from_host(kv.bits),
       d_cmp = DeviceBuffer::from_host(cmp.bits), d_do = DeviceBuffer::from_host(dout.bits),
       d_sink = DeviceBuffer::from_host(sink), d_wb = DeviceBuffer::from_host(win_begin),
       d_cb = DeviceBuffer::from_host(cmp_begin), d_ce = DeviceBuffer::from_host(cmp_end);
  DeviceBuffer d_sel = cs.csa ? DeviceBuffer::from_host(sel) : DeviceBuffer();
  trex::cuda::SparseKeySets gk;
  gk.win_begin = d_wb.as<int64_t>();
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
  auto scratch = poisoned<float>(trex::cuda::sparse_attention_bwd_scratch(N, H));
  trex::cuda::sparse_attention_fwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N,
                                   H, c, gk, g_o.as<bf16>(), g_lse.as<float>(), nullptr, kernel);
  trex::cuda::sparse_attention_bwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N,
                                   E, H, c, gk, g_o.as<bf16>(), g_lse.as<float>(), d_do.as<bf16>(),
                                   g_dq.as<bf16>(), g_dkv.as<float>(), g_dcmp.as<float>(),
                                   g_dsink.as<float>(), scratch.as<float>(), nullptr, kernel);
  TREX_CUDA(cudaDeviceSynchronize());
  const std::string what = std::string(cs.csa ? "CSA" : "HCA") + " c=" + std::to_string(c) +
                           " H=" + std::to_string(H) +
                           (kernel == SparseAttnKernel::CudaCore ? " (CUDA cores)" : " (tensor cores)");
  EXPECT_LT(rel_err(to_f32(g_o.to_host<uint16_t>()), o), 1e-2) << what;
  EXPECT_LT(rel_err(g_lse.to_host<float>(), lse), 1e-5) << what;
  EXPECT_LT(rel_err(to_f32(g_dq.to_host<uint16_t>()), dq), 1e-2) << what;
  EXPECT_LT(rel_err(g_dkv.to_host<float>(), dkv), 1e-2) << what;
  EXPECT_LT(rel_err(g_dcmp.to_host<float>(), dcmp), 1e-2) << what;
  EXPECT_LT(rel_err(g_dsink.to_host<float>(), dsink), 1e-2) << what;
  if (kernel != SparseAttnKernel::TensorCore) return;
  // Every forward tiling of the tensor-core kernel (the default above picks one per shape in attention_sparse.cu).
  using trex::cuda::mma_attn::FwdTiling;
  for (FwdTiling tiling : {FwdTiling::Keys32, FwdTiling::Keys64, FwdTiling::Keys64Warps4, FwdTiling::MultiQuery,
                           FwdTiling::SplitDims, FwdTiling::SplitDims32, FwdTiling::Keys64Warps4Prefetch,
                           FwdTiling::MultiQueryPrefetch, FwdTiling::Keys64Prefetch, FwdTiling::Wgmma,
                           FwdTiling::WgmmaSplitS}) {
    auto t_o = poisoned<uint16_t>(N * H * c), t_lse = poisoned<float>(N * H);
    trex::cuda::mma_attn::fwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N, H, c, gk,
                              t_o.as<bf16>(), t_lse.as<float>(), nullptr, tiling);
    TREX_CUDA(cudaDeviceSynchronize());
    const std::string tw = what + " forward tiling " + std::to_string(int(tiling)) +
                           " (attention_sparse_mma.h FwdTiling order)";
    EXPECT_LT(rel_err(to_f32(t_o.to_host<uint16_t>()), o), 1e-2) << tw;
    EXPECT_LT(rel_err(t_lse.to_host<float>(), lse), 1e-5) << tw;
  }
  // Every backward tiling (Keys32; MultiQuery: blocks of floor(64 / H) queries when H <= 32, else Keys32;
  // SplitDims: 16 heads per block, 4 warps splitting c), from the CPU o / lse rounded as the GPU keeps them.
  // dsink from its per-(query, head) partials summed here.
  using trex::cuda::mma_attn::BwdTiling;
  for (BwdTiling tiling : {BwdTiling::Keys32, BwdTiling::MultiQuery, BwdTiling::SplitDims, BwdTiling::Keys32Prefetch,
                           BwdTiling::MultiQueryPrefetch, BwdTiling::SplitDims32}) {
    std::vector<uint16_t> o_bits(o.size());
    for (size_t k = 0; k < o.size(); ++k) o_bits[k] = trex::f32_to_bf16(o[k]);
    auto m_o = DeviceBuffer::from_host(o_bits), m_lse = DeviceBuffer::from_host(lse);
    auto m_dq = poisoned<uint16_t>(N * H * c), m_part = poisoned<float>(N * H);
    auto m_dkv = zeroed<float>(N * c), m_dcmp = zeroed<float>(E * c);
    trex::cuda::mma_attn::bwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N, H, c, gk,
                              m_o.as<bf16>(), m_lse.as<float>(), d_do.as<bf16>(), m_dq.as<bf16>(), m_dkv.as<float>(),
                              m_dcmp.as<float>(), m_part.as<float>(), nullptr, tiling);
    TREX_CUDA(cudaDeviceSynchronize());
    const std::vector<float> part = m_part.to_host<float>();
    std::vector<float> m_dsink(H, 0.f);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h) m_dsink[h] += part[size_t(i * H + h)];
    const std::string tw = what + " backward tiling " + std::to_string(int(tiling)) + " (BwdTiling order)";
    EXPECT_LT(rel_err(to_f32(m_dq.to_host<uint16_t>()), dq), 1e-2) << tw;
    EXPECT_LT(rel_err(m_dkv.to_host<float>(), dkv), 1e-2) << tw;
    EXPECT_LT(rel_err(m_dcmp.to_host<float>(), dcmp), 1e-2) << tw;
    EXPECT_LT(rel_err(m_dsink, dsink), 1e-2) << tw;
  }
}

}  // namespace

void run_both(const Case& cs) {
  run_case(cs, SparseAttnKernel::TensorCore);
  run_case(cs, SparseAttnKernel::CudaCore);
}

TEST(GpuSparseAttention, CsaSelectionWithEmptySlotsMatchesCpu) {
  run_both({/*N=*/150, /*H=*/20, /*c=*/512, /*E=*/40, /*window=*/40, /*k_sel=*/37, true, 11});
}

TEST(GpuSparseAttention, HcaRangesMatchCpu) {
  run_both({/*N=*/131, /*H=*/16, /*c=*/256, /*E=*/34, /*window=*/64, /*k_sel=*/0, false, 21});
}

TEST(GpuSparseAttention, WindowOnlyManyHeadsMatchesCpu) {
  run_both({/*N=*/70, /*H=*/64, /*c=*/512, /*E=*/0, /*window=*/128, /*k_sel=*/0, false, 31});
}

// V4 (flash) shapes: c = 512, 64 heads, a 128-row window and 100 selected slots (not a multiple of 32).
TEST(GpuSparseAttention, CsaV4HeadsMatchesCpu) {
  run_both({/*N=*/200, /*H=*/64, /*c=*/512, /*E=*/50, /*window=*/128, /*k_sel=*/100, true, 41});
}

TEST(GpuSparseAttention, HcaV4HeadsMatchesCpu) {
  run_both({/*N=*/180, /*H=*/64, /*c=*/512, /*E=*/90, /*window=*/128, /*k_sel=*/0, false, 51});
}

// small-s6 shapes: c = 512, 16 heads (one m-tile: the split-dims kernels' H = 16 path), a 128-row window and 70
// selected slots with empty ones.
TEST(GpuSparseAttention, CsaSixteenHeadsMatchesCpu) {
  run_both({/*N=*/260, /*H=*/16, /*c=*/512, /*E=*/64, /*window=*/128, /*k_sel=*/70, true, 91});
}

// 48 heads: the tensor-core kernel pads a 64-head block; 24 heads: a 32-head block; c = 256 with 64 heads.
TEST(GpuSparseAttention, PaddedHeadBlocksMatchCpu) {
  run_both({/*N=*/97, /*H=*/48, /*c=*/512, /*E=*/30, /*window=*/50, /*k_sel=*/45, true, 61});
  run_both({/*N=*/97, /*H=*/24, /*c=*/512, /*E=*/30, /*window=*/50, /*k_sel=*/0, false, 71});
  run_both({/*N=*/97, /*H=*/64, /*c=*/256, /*E=*/30, /*window=*/50, /*k_sel=*/33, true, 81});
}
