// The chunked LM-head + cross-entropy (CUDA) against the CPU path: logits = hidden W^T (trex::cpu::gemm),
// trex::cpu::cross_entropy_fwd / _bwd, dHidden = dlogits W, dW = dlogits^T hidden. The vocabulary is not a
// multiple of the chunk; some rows are ignored (target -1).
// Tolerances: lse, row losses 1e-5 relative L2 (fp32 everywhere after the exact bf16 products); loss sum
// 1e-5 relative; dhidden, dW 1e-2 relative L2 (dlogits rounded to bf16 before the two GEMMs, as on the GPU
// path).
// The training pass lm_head_ce_fwd_grad (row blocks, gradient formed in the forward) against a double CPU
// reference and against the fwd + bwd (recompute) path: ragged last row block, a row block larger than n,
// a vocabulary that is not a multiple of 4 (scalar kernel), ignored rows; dhidden must be written whole
// (NaN-poisoned before), dW accumulated onto what it held.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "gpu_test_util.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/lm_head_ce.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

TEST(GpuLmHeadCe, ChunkedForwardBackwardMatchesCpu) {
  const int64_t n = 96, d = 256, V = 1000, chunk = 384;
  const float scale = 1.f / 80.f;
  auto hidden = random_bf16(n * d, 41), w = random_bf16(V * d, 42, 0.5f);
  std::vector<int32_t> targets(n);
  std::mt19937 g(43);
  for (auto& t : targets) t = int32_t(g() % V);
  for (int64_t r = 0; r < n; r += 7) targets[r] = -1;

  std::vector<float> logits(n * V), lse(n), dlogits(n * V), dh(n * d), dw(V * d);
  trex::cpu::gemm(logits.data(), hidden.values.data(), w.values.data(), n, V, d, false, true);
  const double total = trex::cpu::cross_entropy_fwd(lse.data(), logits.data(), targets.data(), n, V);
  trex::cpu::cross_entropy_bwd(dlogits.data(), logits.data(), lse.data(), targets.data(), n, V, scale);
  trex::cpu::gemm(dh.data(), dlogits.data(), w.values.data(), n, d, V, false, false);
  trex::cpu::gemm(dw.data(), dlogits.data(), hidden.values.data(), V, d, n, true, false);
  std::vector<float> row_loss(n, 0.f);
  for (int64_t r = 0; r < n; ++r)
    if (targets[r] >= 0) row_loss[r] = lse[r] - logits[r * V + targets[r]];

  trex::cuda::Gemm gemm;
  trex::cuda::LmHeadCeShape s{n, d, V, chunk};
  auto d_h = DeviceBuffer::from_host(hidden.bits), d_w = DeviceBuffer::from_host(w.bits),
       d_t = DeviceBuffer::from_host(targets);
  DeviceBuffer scratch(trex::cuda::lm_head_ce_scratch_bytes(s));
  TREX_CUDA(cudaMemset(scratch.as(), 0xff, scratch.bytes()));
  auto g_lse = poisoned<float>(n), g_loss = poisoned<float>(n), g_sum = poisoned<float>(1);
  auto g_dh = zeroed<float>(n * d), g_dw = zeroed<float>(V * d);
  trex::cuda::lm_head_ce_fwd(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), g_lse.as<float>(),
                             g_loss.as<float>(), g_sum.as<float>(), scratch.as());
  trex::cuda::lm_head_ce_bwd(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), g_lse.as<float>(),
                             scale, g_dh.as<float>(), g_dw.as<float>(), scratch.as());
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(g_lse.to_host<float>(), lse), 1e-5);
  EXPECT_LT(rel_err(g_loss.to_host<float>(), row_loss), 1e-5);
  EXPECT_NEAR(g_sum.to_host<float>()[0], total, 1e-5 * std::abs(total));
  EXPECT_LT(rel_err(g_dh.to_host<float>(), dh), 1e-2);
  EXPECT_LT(rel_err(g_dw.to_host<float>(), dw), 1e-2);
}

namespace {

// Double reference of the head: lse, row losses (0 for ignored rows), their sum, dhidden and dW of
// scale * sum(row_loss) from the exact bf16 inputs.
struct HeadRef {
  std::vector<double> lse, row_loss, dh, dw;
  double total = 0;
};

HeadRef head_ref(const std::vector<float>& h, const std::vector<float>& w, const std::vector<int32_t>& t, int64_t n,
                 int64_t d, int64_t V, double scale) {
  HeadRef r;
  r.lse.assign(size_t(n), 0), r.row_loss.assign(size_t(n), 0), r.dh.assign(size_t(n * d), 0);
  r.dw.assign(size_t(V * d), 0);
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t k = 0; k < d; ++k) acc += double(h[size_t(i * d + k)]) * w[size_t(v * d + k)];
      z[size_t(v)] = acc, mx = std::max(mx, acc);
    }
    double se = 0;
    for (double x : z) se += std::exp(x - mx);
    const double l = mx + std::log(se);
    r.lse[size_t(i)] = l;
    if (t[size_t(i)] < 0) continue;
    r.row_loss[size_t(i)] = l - z[size_t(t[size_t(i)])];
    r.total += r.row_loss[size_t(i)];
    for (int64_t v = 0; v < V; ++v) {
      const double g = scale * (std::exp(z[size_t(v)] - l) - (v == t[size_t(i)] ? 1.0 : 0.0));
      for (int64_t k = 0; k < d; ++k) {
        r.dh[size_t(i * d + k)] += g * w[size_t(v * d + k)];
        r.dw[size_t(v * d + k)] += g * h[size_t(i * d + k)];
      }
    }
  }
  return r;
}

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

struct FwdGradCase {
  int64_t n, d, V, rows, grad_rows;
};

class GpuLmHeadCeFwdGrad : public ::testing::TestWithParam<FwdGradCase> {};

TEST_P(GpuLmHeadCeFwdGrad, MatchesDoubleReferenceAndRecomputePath) {
  const auto [n, d, V, rows, grad_rows] = GetParam();
  const float scale = 1.f / float(n);
  auto hidden = random_bf16(size_t(n * d), 51), w = random_bf16(size_t(V * d), 52, 0.5f);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  std::mt19937 g(53);
  for (auto& t : targets) t = int32_t(g() % uint32_t(V));
  for (int64_t r = 0; r < n; r += 5) targets[size_t(r)] = -1;
  targets[size_t(n - 1)] = int32_t(V - 1);  // the last vocabulary entry (the scalar / vector tail)
  const HeadRef ref = head_ref(hidden.values, w.values, targets, n, d, V, scale);
  // dW starts non-zero: both paths must accumulate onto it.
  const std::vector<float> dw0 = random_f32(size_t(V * d), 54, 0.01f);
  std::vector<double> dw_ref(ref.dw);
  for (size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] += dw0[i];

  trex::cuda::Gemm gemm;
  trex::cuda::LmHeadCeShape s{n, d, V, 256, rows, grad_rows};
  auto d_h = DeviceBuffer::from_host(hidden.bits), d_w = DeviceBuffer::from_host(w.bits),
       d_t = DeviceBuffer::from_host(targets);
  DeviceBuffer scratch(trex::cuda::lm_head_ce_fwd_grad_scratch_bytes(s));
  TREX_CUDA(cudaMemset(scratch.as(), 0xff, scratch.bytes()));
  auto f_lse = poisoned<float>(size_t(n)), f_loss = poisoned<float>(size_t(n)), f_sum = poisoned<float>(1);
  auto f_dh = poisoned<float>(size_t(n * d));  // written whole, ignored rows included
  auto f_dw = DeviceBuffer::from_host(dw0);
  trex::cuda::lm_head_ce_fwd_grad(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), scale,
                                  f_lse.as<float>(), f_loss.as<float>(), f_sum.as<float>(), f_dh.as<float>(),
                                  f_dw.as<float>(), scratch.as());
  // The recompute path on the same inputs.
  DeviceBuffer scratch2(trex::cuda::lm_head_ce_scratch_bytes(s));
  auto r_lse = poisoned<float>(size_t(n)), r_loss = poisoned<float>(size_t(n)), r_sum = poisoned<float>(1);
  auto r_dh = zeroed<float>(size_t(n * d));
  auto r_dw = DeviceBuffer::from_host(dw0);
  trex::cuda::lm_head_ce_fwd(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), r_lse.as<float>(),
                             r_loss.as<float>(), r_sum.as<float>(), scratch2.as());
  trex::cuda::lm_head_ce_bwd(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), r_lse.as<float>(), scale,
                             r_dh.as<float>(), r_dw.as<float>(), scratch2.as());
  TREX_CUDA(cudaDeviceSynchronize());

  const auto lse = f_lse.to_host<float>(), loss = f_loss.to_host<float>();
  const auto dh = f_dh.to_host<float>(), dw = f_dw.to_host<float>();
  // Against the double reference (fp32 logits from exact bf16 products; dlogits rounded to bf16).
  EXPECT_LT(rel_err(lse, to_float(ref.lse)), 1e-5);
  EXPECT_LT(rel_err(loss, to_float(ref.row_loss)), 1e-5);
  EXPECT_NEAR(f_sum.to_host<float>()[0], ref.total, 1e-5 * ref.total);
  EXPECT_LT(rel_err(dh, to_float(ref.dh)), 1e-2);
  EXPECT_LT(rel_err(dw, to_float(dw_ref)), 1e-2);
  int64_t n_ignored = 0;
  for (int64_t r = 0; r < n; ++r) {  // ignored rows: no loss, no gradient
    if (targets[size_t(r)] >= 0) continue;
    ++n_ignored;
    EXPECT_EQ(loss[size_t(r)], 0.f) << "row " << r;
    for (int64_t k = 0; k < d; ++k) ASSERT_EQ(dh[size_t(r * d + k)], 0.f) << "row " << r;
  }
  EXPECT_GT(n_ignored, 0);
  // Against the recompute path: the same numbers up to summation order (and rare bf16 rounding flips).
  EXPECT_LT(rel_err(lse, r_lse.to_host<float>()), 1e-6);
  EXPECT_LT(rel_err(loss, r_loss.to_host<float>()), 1e-5);
  EXPECT_NEAR(f_sum.to_host<float>()[0], r_sum.to_host<float>()[0], 1e-5 * ref.total);
  EXPECT_LT(rel_err(dh, r_dh.to_host<float>()), 2e-3);
  EXPECT_LT(rel_err(dw, r_dw.to_host<float>()), 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLmHeadCeFwdGrad,
                         ::testing::Values(FwdGradCase{96, 128, 1000, 40, 0},   // ragged last row block (16 rows)
                                           FwdGradCase{50, 64, 997, 64, 0},     // one block > n; V % 4 != 0
                                           FwdGradCase{64, 96, 512, 16, 0},     // blocks dividing n exactly
                                           FwdGradCase{96, 64, 1000, 24, 40},   // dW groups 40 40 16 of blocks 24 + 16
                                           FwdGradCase{96, 64, 1000, 16, 64},   // groups 64 32 of whole blocks
                                           FwdGradCase{80, 64, 996, 32, 500})); // one group (> n) of blocks 32 32 16

TEST(GpuLmHeadCeFwdGrad, EmptyBatchIsANoOp) {
  trex::cuda::Gemm gemm;
  trex::cuda::LmHeadCeShape s{0, 64, 100, 32, 16};
  trex::cuda::lm_head_ce_fwd_grad(gemm, s, nullptr, nullptr, nullptr, 1.f, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, nullptr);
  EXPECT_THROW(trex::cuda::lm_head_ce_fwd_grad(gemm, trex::cuda::LmHeadCeShape{4, 64, 100, 32, 0}, nullptr,
                                               nullptr, nullptr, 1.f, nullptr, nullptr, nullptr, nullptr, nullptr,
                                               nullptr),
               trex::Error);
}

// The benchmark head shapes (vocabulary 129280): flash-l4 at 8192 tokens (d 4096) and small-s6 at 4096 (d 2048).
// Milliseconds of the recompute path (fwd, bwd) and of the training pass per row-block size, with the three
// GEMMs of one row block timed alone. Run with --gtest_also_run_disabled_tests.
namespace {

void time_head(int64_t n, int64_t d, const char* name) {
  const int64_t V = 129280;
  // Weights: a random 16 Mi-element tile repeated (timing only).
  const size_t tile = size_t(1) << 24;
  auto rnd = random_bf16(tile, 61, 0.02f), hid = random_bf16(size_t(n * d), 62);
  DeviceBuffer d_w(size_t(V * d) * 2);
  for (size_t off = 0; off < size_t(V * d); off += tile)
    TREX_CUDA(cudaMemcpy(d_w.as<uint16_t>() + off, rnd.bits.data(), std::min(tile, size_t(V * d) - off) * 2,
                         cudaMemcpyHostToDevice));
  std::vector<int32_t> targets(static_cast<size_t>(n));
  std::mt19937 g(63);
  for (auto& t : targets) t = int32_t(g() % uint32_t(V));
  auto d_h = DeviceBuffer::from_host(hid.bits), d_t = DeviceBuffer::from_host(targets);
  auto lse = zeroed<float>(size_t(n)), loss = zeroed<float>(size_t(n)), sum = zeroed<float>(1);
  auto dh = zeroed<float>(size_t(n * d)), dw = zeroed<float>(size_t(V * d));
  trex::cuda::Gemm gemm;
  cudaEvent_t e0, e1;
  TREX_CUDA(cudaEventCreate(&e0));
  TREX_CUDA(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& fn) {
    fn();  // warm-up (plans, heuristics)
    TREX_CUDA(cudaEventRecord(e0));
    const int reps = 3;
    for (int i = 0; i < reps; ++i) fn();
    TREX_CUDA(cudaEventRecord(e1));
    TREX_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    TREX_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    return ms / reps;
  };
  const double gemm_tflop = 2.0 * double(n) * double(V) * double(d) * 1e-12;
  {
    trex::cuda::LmHeadCeShape s{n, d, V, 8192};
    DeviceBuffer scratch(trex::cuda::lm_head_ce_scratch_bytes(s));
    const float fwd = time_ms([&] {
      trex::cuda::lm_head_ce_fwd(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), lse.as<float>(),
                                 loss.as<float>(), sum.as<float>(), scratch.as());
    });
    const float bwd = time_ms([&] {
      trex::cuda::lm_head_ce_bwd(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), lse.as<float>(),
                                 1.f / float(n), dh.as<float>(), dw.as<float>(), scratch.as());
    });
    std::printf("LMHEAD %s recompute chunk 8192: fwd %.2f ms bwd %.2f ms total %.2f ms (%.0f TFLOP/s over 4 GEMMs)\n",
                name, fwd, bwd, fwd + bwd, 4 * gemm_tflop / ((fwd + bwd) * 1e-3));
  }
  const std::pair<int64_t, int64_t> configs[] = {{2048, 2048}, {1024, 1024}, {1024, 2048}, {1024, 4096},
                                                 {512, 4096},   {2048, 4096}, {4096, 4096}};
  for (const auto& [rows, grad_rows] : configs) {
    if (rows > n || grad_rows > n) continue;
    trex::cuda::LmHeadCeShape s{n, d, V, 8192, rows, grad_rows};
    DeviceBuffer scratch(trex::cuda::lm_head_ce_fwd_grad_scratch_bytes(s));
    const float ms = time_ms([&] {
      trex::cuda::lm_head_ce_fwd_grad(gemm, s, d_h.as<bf16>(), d_w.as<bf16>(), d_t.as<int32_t>(), 1.f / float(n),
                                      lse.as<float>(), loss.as<float>(), sum.as<float>(), dh.as<float>(),
                                      dw.as<float>(), scratch.as());
    });
    // The GEMMs of one logits block and one dW group alone, on the real logits / dlogits the pass left behind,
    // scaled to the whole pass.
    const float* logits = scratch.as<float>();
    const bf16* dl = reinterpret_cast<const bf16*>(scratch.as<char>() + (size_t(rows * V * 4) + 255) / 256 * 256);
    const float g1 = time_ms([&] {
      gemm.run({rows, V, d, false, true, trex::cuda::GemmType::BF16, trex::cuda::GemmType::F32}, d_h.as<bf16>(),
               d_w.as<bf16>(), const_cast<float*>(logits), 1.f, 0.f);
    });
    const float g2 = time_ms([&] {
      gemm.run({rows, d, V, false, false, trex::cuda::GemmType::BF16, trex::cuda::GemmType::F32}, dl, d_w.as<bf16>(),
               dh.as<float>(), 1.f, 0.f);
    });
    const float g3 = time_ms([&] {
      gemm.run({V, d, grad_rows, true, false, trex::cuda::GemmType::BF16, trex::cuda::GemmType::F32}, dl,
               d_h.as<bf16>(), dw.as<float>(), 1.f, 1.f);
    });
    const float nb = float(n) / float(rows), ng = float(n) / float(grad_rows);
    const float gemms = nb * (g1 + g2) + ng * g3;
    std::printf("LMHEAD %s fwd_grad rows %ld grad_rows %ld: %.2f ms (%.0f TFLOP/s over 3 GEMMs), scratch %.0f MB; "
                "alone logits %.2f x %.0f, dX %.2f x %.0f, dW %.2f x %.0f = %.2f ms, rest %.2f ms\n",
                name, long(rows), long(grad_rows), ms, 3 * gemm_tflop / (ms * 1e-3), double(scratch.bytes()) / 1e6,
                g1, nb, g2, nb, g3, ng, gemms, ms - gemms);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
}

}  // namespace

TEST(GpuLmHeadCeFwdGrad, DISABLED_TimingFlashL4) { time_head(8192, 4096, "flash-l4"); }
TEST(GpuLmHeadCeFwdGrad, DISABLED_TimingSmallS6) { time_head(4096, 2048, "small-s6"); }
