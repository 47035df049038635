// The CUDA lightning-indexer top-k (both scorers: tensor cores and CUDA cores) against scores computed here in
// double on the same bf16 inputs. fp32 sums in another order may swap entries whose scores are within rounding
// of each other, so the check is the top-k invariant with a tolerance: every query gets min(k, visible) distinct
// visible entries (the rest -1), best first, each scoring at least the k-th best reference score minus tol, and
// entries clearly above the cut-off are all selected. tol = 1e-4 x the largest |score| of the query.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "gpu_test_util.h"
#include "kernels/cuda/indexer.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using trex::cuda::IndexerKernel;
using namespace trex::gpu_test;

namespace {

struct IdxCase {
  int64_t N, NI, CI, E, k_sel;
  uint32_t seed;
};

void run_case(const IdxCase& cs, IndexerKernel kernel) {
  const int64_t N = cs.N, NI = cs.NI, CI = cs.CI, E = cs.E, k = cs.k_sel;
  // Two packed documents: the first sees entries [0, E/2), the second [E/2, E), growing with the position (up to
  // more than one 128-key tile of the tensor-core kernel).
  const int64_t doc2 = N / 2;
  std::vector<int64_t> vb(N), ve(N);
  int64_t max_vis = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t pos = i < doc2 ? i : i - doc2;
    vb[i] = i < doc2 ? 0 : E / 2;
    ve[i] = vb[i] + std::min<int64_t>(E / 2, pos + 1);
    max_vis = std::max(max_vis, ve[i] - vb[i]);
  }
  auto q = random_bf16(N * NI * CI, cs.seed + 1), keys = random_bf16(E * CI, cs.seed + 2);
  std::vector<float> w = random_f32(N * NI, cs.seed + 3);
  const double w_scale = 1.0 / std::sqrt(double(NI));

  auto d_q = DeviceBuffer::from_host(q.bits), d_k = DeviceBuffer::from_host(keys.bits),
       d_w = DeviceBuffer::from_host(w), d_vb = DeviceBuffer::from_host(vb), d_ve = DeviceBuffer::from_host(ve);
  auto d_sel = poisoned<int64_t>(N * k);
  trex::cuda::IndexerTopkArgs a;
  a.n_tok = N, a.n_heads = NI, a.head_dim = CI, a.k_sel = k, a.max_visible = max_vis;
  a.w_scale = float(w_scale), a.vis_begin = d_vb.as<int64_t>(), a.vis_end = d_ve.as<int64_t>();
  trex::cuda::indexer_topk(d_sel.as<int64_t>(), d_q.as<bf16>(), d_w.as<float>(), d_k.as<bf16>(), a, nullptr,
                           kernel);
  TREX_CUDA(cudaDeviceSynchronize());
  const std::vector<int64_t> sel = d_sel.to_host<int64_t>();

  const std::string what = "NI=" + std::to_string(NI) + " CI=" + std::to_string(CI) +
                           (kernel == IndexerKernel::CudaCore ? " (CUDA cores)" : " (auto: tensor cores)");
  int64_t checked_above_cut = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t nv = ve[i] - vb[i], take = std::min(k, nv);
    std::vector<double> r(static_cast<size_t>(nv));
    double amax = 0;
    for (int64_t s = 0; s < nv; ++s) {
      double score = 0;
      for (int64_t h = 0; h < NI; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < CI; ++d)
          dot += double(q.values[size_t((i * NI + h) * CI + d)]) * keys.values[size_t((vb[i] + s) * CI + d)];
        score += w[size_t(i * NI + h)] * w_scale * std::max(dot, 0.0);
      }
      r[size_t(s)] = score / std::sqrt(double(CI));
      amax = std::max(amax, std::abs(r[size_t(s)]));
    }
    const double tol = 1e-4 * std::max(amax, 1e-6);
    std::vector<double> sorted = r;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    const double cut = take > 0 ? sorted[size_t(take - 1)] : 0.0;
    std::set<int64_t> chosen;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = sel[size_t(i * k + j)];
      if (j >= take) {
        ASSERT_EQ(e, -1) << what << ": query " << i << " slot " << j << " should be empty";
        continue;
      }
      ASSERT_TRUE(e >= vb[i] && e < ve[i]) << what << ": query " << i << " slot " << j << " entry " << e
                                           << " outside [" << vb[i] << ", " << ve[i] << ")";
      ASSERT_TRUE(chosen.insert(e).second) << what << ": query " << i << " selects entry " << e << " twice";
      const double re = r[size_t(e - vb[i])];
      ASSERT_GE(re, cut - tol) << what << ": query " << i << " selects entry " << e << " below the cut-off";
      if (j > 0) {
        const double prev = r[size_t(sel[size_t(i * k + j - 1)] - vb[i])];
        ASSERT_GE(prev, re - tol) << what << ": query " << i << " slots " << j - 1 << ", " << j << " out of order";
      }
    }
    for (int64_t s = 0; s < nv; ++s)
      if (r[size_t(s)] > cut + tol) {
        ASSERT_TRUE(chosen.count(vb[i] + s)) << what << ": query " << i << " misses entry " << vb[i] + s;
        ++checked_above_cut;
      }
  }
  EXPECT_GT(checked_above_cut, N) << what << ": the case checks too few clear selections";
}

}  // namespace

TEST(GpuIndexer, TopkV4ShapesMatchesReference) {
  run_case({/*N=*/500, /*NI=*/64, /*CI=*/128, /*E=*/300, /*k_sel=*/24, 7}, IndexerKernel::Auto);
  run_case({/*N=*/500, /*NI=*/64, /*CI=*/128, /*E=*/300, /*k_sel=*/24, 7}, IndexerKernel::CudaCore);
}

TEST(GpuIndexer, TopkSmallHeadsAndPartialTilesMatchesReference) {
  run_case({/*N=*/130, /*NI=*/16, /*CI=*/64, /*E=*/90, /*k_sel=*/40, 17}, IndexerKernel::Auto);
  run_case({/*N=*/130, /*NI=*/16, /*CI=*/64, /*E=*/90, /*k_sel=*/40, 17}, IndexerKernel::CudaCore);
  run_case({/*N=*/90, /*NI=*/8, /*CI=*/64, /*E=*/60, /*k_sel=*/10, 27}, IndexerKernel::Auto);  // CUDA cores only
}

// Head counts without a kernel of their own run the next larger one with zero heads appended (the golden fixture
// v4-tiny-b has 12 indexer heads of 16 dims).
TEST(GpuIndexer, TopkOddHeadCountsMatchReference) {
  run_case({/*N=*/96, /*NI=*/12, /*CI=*/16, /*E=*/70, /*k_sel=*/8, 31}, IndexerKernel::Auto);
  run_case({/*N=*/64, /*NI=*/3, /*CI=*/32, /*E=*/50, /*k_sel=*/6, 37}, IndexerKernel::Auto);
  run_case({/*N=*/64, /*NI=*/40, /*CI=*/64, /*E=*/50, /*k_sel=*/6, 41}, IndexerKernel::Auto);
}

// Many exactly equal scores (the keys repeat 5 distinct rows, so every entry of a class scores the same bits on
// either scorer): the selection must be the exact top-k with ties taken by the lower entry, best first, also when
// the cut-off falls inside a class (the radix select's equal-key ranks).
TEST(GpuIndexer, TopkTiesTakeLowerEntriesFirst) {
  const int64_t N = 40, NI = 16, CI = 64, E = 700, k = 100, n_cls = 5;
  auto q = random_bf16(N * NI * CI, 41), base = random_bf16(n_cls * CI, 42);
  std::vector<float> w = random_f32(N * NI, 43);
  std::vector<uint16_t> kbits(size_t(E * CI));
  std::vector<float> kvals(size_t(E * CI));
  for (int64_t s = 0; s < E; ++s)
    for (int64_t d = 0; d < CI; ++d) {
      kbits[size_t(s * CI + d)] = base.bits[size_t((s % n_cls) * CI + d)];
      kvals[size_t(s * CI + d)] = base.values[size_t((s % n_cls) * CI + d)];
    }
  std::vector<int64_t> vb(N), ve(N);
  for (int64_t i = 0; i < N; ++i) vb[i] = i % 3, ve[i] = E - (i % 7);  // 600+ visible: past the k-slot buffer
  auto d_q = DeviceBuffer::from_host(q.bits), d_k = DeviceBuffer::from_host(kbits), d_w = DeviceBuffer::from_host(w),
       d_vb = DeviceBuffer::from_host(vb), d_ve = DeviceBuffer::from_host(ve);
  for (IndexerKernel kernel : {IndexerKernel::Auto, IndexerKernel::CudaCore}) {
    auto d_sel = poisoned<int64_t>(N * k);
    trex::cuda::IndexerTopkArgs a;
    a.n_tok = N, a.n_heads = NI, a.head_dim = CI, a.k_sel = k, a.max_visible = E;
    a.w_scale = 0.25f, a.vis_begin = d_vb.as<int64_t>(), a.vis_end = d_ve.as<int64_t>();
    trex::cuda::indexer_topk(d_sel.as<int64_t>(), d_q.as<bf16>(), d_w.as<float>(), d_k.as<bf16>(), a, nullptr,
                             kernel);
    TREX_CUDA(cudaDeviceSynchronize());
    const std::vector<int64_t> sel = d_sel.to_host<int64_t>();
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> cls(static_cast<size_t>(n_cls));
      for (int64_t c = 0; c < n_cls; ++c) {
        double score = 0;
        for (int64_t h = 0; h < NI; ++h) {
          double dot = 0;
          for (int64_t d = 0; d < CI; ++d)
            dot += double(q.values[size_t((i * NI + h) * CI + d)]) * kvals[size_t(c * CI + d)];
          score += w[size_t(i * NI + h)] * std::max(dot, 0.0);
        }
        cls[size_t(c)] = score;
      }
      std::vector<int64_t> want;
      for (int64_t s = vb[i]; s < ve[i]; ++s) want.push_back(s);
      std::stable_sort(want.begin(), want.end(),
                       [&](int64_t x, int64_t y) { return cls[size_t(x % n_cls)] > cls[size_t(y % n_cls)]; });
      want.resize(size_t(k));
      const std::vector<int64_t> got(sel.begin() + i * k, sel.begin() + (i + 1) * k);
      ASSERT_EQ(got, want) << (kernel == IndexerKernel::CudaCore ? "CUDA cores" : "tensor cores") << ": query "
                           << i;
    }
  }
}

// NaN scores (non-finite indexer weights, as after an optimizer step on inf / NaN gradients) rank as -inf: every
// query still gets exactly its min(k, visible) visible entries, here all tied, so the lowest ones in order, and -1
// after them. Visible counts below k that are not powers of two are the case that leaked the sort's padding index
// (0x7fffffff) into the selection, which the sparse attention then read far outside the keys.
TEST(GpuIndexer, TopkNanScoresSelectVisibleEntriesOnly) {
  const int64_t N = 300, NI = 64, CI = 128, E = 700, k = 64;
  auto q = random_bf16(N * NI * CI, 51), keys = random_bf16(E * CI, 52);
  std::vector<float> w(size_t(N * NI), std::nanf(""));
  std::vector<int64_t> vb(N), ve(N);
  for (int64_t i = 0; i < N; ++i) vb[i] = i % 5, ve[i] = vb[i] + std::min<int64_t>(E - 5, 1 + 3 * i);  // 1 .. 695
  auto d_q = DeviceBuffer::from_host(q.bits), d_k = DeviceBuffer::from_host(keys.bits),
       d_w = DeviceBuffer::from_host(w), d_vb = DeviceBuffer::from_host(vb), d_ve = DeviceBuffer::from_host(ve);
  for (IndexerKernel kernel : {IndexerKernel::Auto, IndexerKernel::CudaCore}) {
    auto d_sel = poisoned<int64_t>(N * k);
    trex::cuda::IndexerTopkArgs a;
    a.n_tok = N, a.n_heads = NI, a.head_dim = CI, a.k_sel = k, a.max_visible = E;
    a.w_scale = 0.125f, a.vis_begin = d_vb.as<int64_t>(), a.vis_end = d_ve.as<int64_t>();
    trex::cuda::indexer_topk(d_sel.as<int64_t>(), d_q.as<bf16>(), d_w.as<float>(), d_k.as<bf16>(), a, nullptr,
                             kernel);
    TREX_CUDA(cudaDeviceSynchronize());
    const std::vector<int64_t> sel = d_sel.to_host<int64_t>();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t take = std::min(k, ve[i] - vb[i]);
      for (int64_t j = 0; j < k; ++j)
        ASSERT_EQ(sel[size_t(i * k + j)], j < take ? vb[i] + j : -1)
            << (kernel == IndexerKernel::CudaCore ? "CUDA cores" : "tensor cores") << ": query " << i << " slot "
            << j << " (" << ve[i] - vb[i] << " visible)";
    }
  }
}
