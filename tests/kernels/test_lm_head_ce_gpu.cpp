// The chunked LM-head + cross-entropy (CUDA) against the CPU path: logits = hidden W^T (trex::cpu::gemm),
// trex::cpu::cross_entropy_fwd / _bwd, dHidden = dlogits W, dW = dlogits^T hidden. The vocabulary is not a
// multiple of the chunk; some rows are ignored (target -1).
// Tolerances: lse, row losses 1e-5 relative L2 (fp32 everywhere after the exact bf16 products); loss sum
// 1e-5 relative; dhidden, dW 1e-2 relative L2 (dlogits rounded to bf16 before the two GEMMs, as on the GPU
// path).
#include <gtest/gtest.h>

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
