// The CUDA sparse attention (forward and backward), both implementations (tensor cores, the default, and the
// fp32 CUDA-core kernels), against trex::cpu::sparse_attention_* in fp32 on the same bf16-rounded inputs:
// packed documents, a sliding window, CSA selections with empty (-1) slots, HCA ranges, head counts that are
// not a multiple of the heads a block serves (16 for CUDA cores; 16, 32 or 64 for tensor cores), V4's
// c = 512 x 64 heads, small-s6's 16 heads, and key counts that are not a multiple of the 32- or 64-key tiles.
// The cases cover every kernel the tensor-core dispatch (attention_sparse_mma.cu) can pick, at c = 256 and 512:
//   forward  H > 32 wgmma (64 heads per block: H = 48, 64, 128), H <= 32 split dims (16 heads per block: H = 16;
//            32: H = 20, 24, 32);
//   backward H > 32 64-head blocks with prefetched keys (H = 48, 64, 128), H <= 32 CSA split dims (H = 16, 20,
//            32), H <= 32 window / HCA multi-query blocks (H = 16, 24).
// The other tilings of those kernels are checked by the dev/attention benchmark (dev/attention/device.sh).
// Tolerances (relative L2): o, dq 1e-2 (bf16 outputs: 2^-9 rounding, fp32 sums in another order);
// lse 1e-5 (fp32); dkv, dcmp, dsink 1e-2 (fp32 sums over bf16 o, whose rounding enters D = dO . O).
// The backward is bitwise deterministic (attention_dkv_reduce.h): the same call twice gives the same bits of dq,
// dkv, dcmp and dsink, checked on key sets where many queries share each key row and entry, with the queries in one
// chunk and in many.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "gpu_test_util.h"
#include "kernels/cpu/attention_sparse.h"
#include "kernels/cuda/attention_sparse.h"

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

// The GPU backward's outputs (bit patterns), for the determinism checks.
struct BwdOut {
  std::vector<uint16_t> dq;
  std::vector<float> dkv, dcmp, dsink;
};

// The CPU reference's outputs of one case, computed once per case (the determinism test runs each case 8 times).
struct Reference {
  std::vector<float> o, lse, dq, dkv, dcmp, dsink;
};

BwdOut run_case(const Case& cs, SparseAttnKernel kernel,
                int64_t partial_budget = trex::cuda::kSparseAttnPartialBudget, Reference* cached = nullptr,
                trex::cuda::SparseAttnBwdOrder order = trex::cuda::SparseAttnBwdOrder::Deterministic) {
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
  Reference local;
  Reference& ref = cached ? *cached : local;
  if (ref.o.empty()) {
    ref.o.resize(N * H * c), ref.lse.resize(N * H), ref.dq.resize(N * H * c);
    ref.dkv.assign(N * c, 0.f), ref.dcmp.assign(E * c, 0.f), ref.dsink.assign(H, 0.f);
    trex::cpu::sparse_attention_fwd(q.values.data(), kv.values.data(), cmp.values.data(), sink.data(), N, H, c,
                                    ck, ref.o.data(), ref.lse.data());
    trex::cpu::sparse_attention_bwd(q.values.data(), kv.values.data(), cmp.values.data(), sink.data(), N, E, H,
                                    c, ck, ref.o.data(), ref.lse.data(), dout.values.data(), ref.dq.data(),
                                    ref.dkv.data(), ref.dcmp.data(), ref.dsink.data());
  }
  const std::vector<float>&o = ref.o, &lse = ref.lse, &dq = ref.dq, &dkv = ref.dkv, &dcmp = ref.dcmp,
                          &dsink = ref.dsink;

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
  auto scratch = poisoned<float>(trex::cuda::sparse_attention_bwd_scratch(N, E, H, c, gk, kernel, partial_budget, order));
  trex::cuda::sparse_attention_fwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N,
                                   H, c, gk, g_o.as<bf16>(), g_lse.as<float>(), nullptr, kernel);
  trex::cuda::sparse_attention_bwd(d_q.as<bf16>(), d_kv.as<bf16>(), d_cmp.as<bf16>(), d_sink.as<float>(), N,
                                   E, H, c, gk, g_o.as<bf16>(), g_lse.as<float>(), d_do.as<bf16>(),
                                   g_dq.as<bf16>(), g_dkv.as<float>(), g_dcmp.as<float>(),
                                   g_dsink.as<float>(), scratch.as<float>(), nullptr, kernel, partial_budget, order);
  TREX_CUDA(cudaDeviceSynchronize());
  const std::string what = std::string(cs.csa ? "CSA" : "HCA") + " c=" + std::to_string(c) +
                           " H=" + std::to_string(H) +
                           (kernel == SparseAttnKernel::CudaCore ? " (CUDA cores)" : " (tensor cores)") +
                           (partial_budget < trex::cuda::kSparseAttnPartialBudget ? " (chunked)" : "") +
                           (order == trex::cuda::SparseAttnBwdOrder::Atomic ? " (atomic order)" : "");
  BwdOut out{g_dq.to_host<uint16_t>(), g_dkv.to_host<float>(), g_dcmp.to_host<float>(), g_dsink.to_host<float>()};
  EXPECT_LT(rel_err(to_f32(g_o.to_host<uint16_t>()), o), 1e-2) << what;
  EXPECT_LT(rel_err(g_lse.to_host<float>(), lse), 1e-5) << what;
  EXPECT_LT(rel_err(to_f32(out.dq), dq), 1e-2) << what;
  EXPECT_LT(rel_err(out.dkv, dkv), 1e-2) << what;
  EXPECT_LT(rel_err(out.dcmp, dcmp), 1e-2) << what;
  EXPECT_LT(rel_err(out.dsink, dsink), 1e-2) << what;
  return out;
}

// Two runs of the same backward: every output bit for bit (memcmp, so -0 / +0 and NaN payloads count too).
void expect_same_bits(const BwdOut& a, const BwdOut& b, const std::string& what) {
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  EXPECT_TRUE(same(a.dq, b.dq)) << what << ": dq differs between two runs";
  EXPECT_TRUE(same(a.dkv, b.dkv)) << what << ": dkv differs between two runs";
  EXPECT_TRUE(same(a.dcmp, b.dcmp)) << what << ": dcmp differs between two runs";
  EXPECT_TRUE(same(a.dsink, b.dsink)) << what << ": dsink differs between two runs";
}

void run_twice(const Case& cs, SparseAttnKernel kernel, int64_t partial_budget, Reference* ref,
               const std::string& what) {
  const BwdOut a = run_case(cs, kernel, partial_budget, ref), b = run_case(cs, kernel, partial_budget, ref);
  expect_same_bits(a, b, what);
}

}  // namespace

// Both kernel families against the CPU; the tensor-core one in both summation orders of the backward (the fixed
// order and the atomic fast path the model runs unless asked to be deterministic).
void run_both(const Case& cs) {
  run_case(cs, SparseAttnKernel::TensorCore);
  run_case(cs, SparseAttnKernel::TensorCore, trex::cuda::kSparseAttnPartialBudget, nullptr,
           trex::cuda::SparseAttnBwdOrder::Atomic);
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

// The split-dims kernels at c = 256 (32 heads per forward block, two 16-head backward blocks per query), and
// 128 heads: two 64-head blocks per query in the wgmma forward and the backward.
TEST(GpuSparseAttention, HeadDim256AndTwoHeadBlocksMatchCpu) {
  run_both({/*N=*/90, /*H=*/32, /*c=*/256, /*E=*/30, /*window=*/48, /*k_sel=*/40, true, 101});
  run_both({/*N=*/60, /*H=*/128, /*c=*/256, /*E=*/20, /*window=*/40, /*k_sel=*/0, false, 111});
}

// Determinism where the atomics used to collide most: 16 compressed entries that every query selects 12 of (most
// entries are in most queries' lists, some twice), a 96-row window over 200 queries (each kv row is in 96 lists),
// HCA ranges over all entries. Every kernel the dispatch picks: 64 heads (one 64-head block per query), 16 heads
// (split dims for CSA, 4-query blocks for window / HCA), 24 heads (2-query blocks), CUDA cores; c = 512 and 256.
// Each twice with the default chunking (all queries in one chunk) and twice with a 2 MiB partial budget (many
// chunks, each reduced before the next): the same bits each time, and the reference's values.
TEST(GpuSparseAttention, BackwardIsBitwiseDeterministic) {
  const int64_t small = int64_t(2) << 20;
  for (const Case& cs : {Case{200, 64, 512, 16, 96, 12, true, 201}, Case{200, 64, 512, 16, 96, 0, false, 202},
                         Case{200, 16, 512, 16, 96, 12, true, 203}, Case{200, 16, 256, 16, 96, 0, false, 204},
                         Case{150, 24, 512, 16, 64, 0, false, 205}}) {
    Reference ref;
    for (const SparseAttnKernel k : {SparseAttnKernel::TensorCore, SparseAttnKernel::CudaCore}) {
      const std::string what = std::string(cs.csa ? "CSA" : "HCA") + " H=" + std::to_string(cs.H) + " c=" +
                               std::to_string(cs.c) + (k == SparseAttnKernel::CudaCore ? " CUDA cores" : " tensor cores");
      run_twice(cs, k, trex::cuda::kSparseAttnPartialBudget, &ref, what + ", one chunk");
      run_twice(cs, k, small, &ref, what + ", 2 MiB chunks");
    }
  }
}

// A query whose window is longer than SparseKeySets.max_win would overflow the per-slot scratch: the size query
// refuses key sets without max_win.
TEST(GpuSparseAttention, BackwardScratchNeedsTheWindowBound) {
  trex::cuda::SparseKeySets k;
  EXPECT_THROW(trex::cuda::sparse_attention_bwd_scratch(64, 0, 16, 512, k), trex::Error);
  k.max_win = 16;
  EXPECT_GT(trex::cuda::sparse_attention_bwd_scratch(64, 0, 16, 512, k), 64 * 16);
}
