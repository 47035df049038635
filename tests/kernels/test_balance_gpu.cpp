// The sequence-wise balance loss on the GPU against the CPU reference (dsv4::balance_loss in fp64): the loss and
// d(loss)/d(scores), on random positive scores and distinct top-k selections, several rows; and bitwise repeatable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/balance.h"
#include "kernels/cuda/device_buffer.h"
#include "model/dsv4/balance.h"

using trex::cuda::DeviceBuffer;

namespace {

void run_case(int64_t B, int64_t T, int64_t E, int64_t K, double alpha, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(0.05f, 2.f);
  const int64_t N = B * T;
  std::vector<float> scores(size_t(N * E));
  for (float& s : scores) s = u(g);
  std::vector<int32_t> sel(size_t(N * K));
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    // Skewed routing (experts 0..3 more often) so that the counts differ across experts.
    std::shuffle(perm.begin() + std::min<int64_t>(4, E - K), perm.end(), g);
    if (g() % 2) std::shuffle(perm.begin(), perm.end(), g);
    std::copy_n(perm.begin(), K, sel.begin() + t * K);
  }
  std::vector<double> sd(scores.begin(), scores.end()), dref(size_t(N * E));
  const double ref = trex::dsv4::balance_loss<double>(sd.data(), sel.data(), B, T, E, K, alpha, dref.data());

  auto d_scores = DeviceBuffer::from_host(scores);
  auto d_sel = DeviceBuffer::from_host(sel);
  DeviceBuffer d_rows(size_t(B) * sizeof(double)), d_ds(size_t(N * E) * sizeof(float)),
      d_scratch(size_t(trex::cuda::balance_loss_scratch(B, T, E)) * sizeof(double));
  std::vector<double> rows[2];
  std::vector<float> ds[2];
  for (int rep = 0; rep < 2; ++rep) {
    trex::cuda::balance_loss(d_scores.as<float>(), d_sel.as<int32_t>(), B, T, E, K, alpha, d_rows.as<double>(),
                             d_ds.as<float>(), d_scratch.as<double>());
    rows[rep] = d_rows.to_host<double>();
    ds[rep] = d_ds.to_host<float>();
  }
  const double got = std::accumulate(rows[0].begin(), rows[0].end(), 0.0);
  EXPECT_NEAR(got, ref, 1e-12 * std::abs(ref)) << "B " << B << " T " << T << " E " << E << " K " << K;
  double num = 0, den = 0;
  for (size_t i = 0; i < dref.size(); ++i) num += (ds[0][i] - dref[i]) * (ds[0][i] - dref[i]), den += dref[i] * dref[i];
  if (den > 0)
    EXPECT_LT(std::sqrt(num / den), 1e-6) << "dscores, B " << B << " T " << T << " E " << E;
  else  // every expert equally loaded (e.g. all selected): the balance gradient is exactly zero
    EXPECT_LT(std::sqrt(num), 1e-12) << "dscores should vanish, B " << B << " T " << T << " E " << E;
  EXPECT_EQ(rows[0], rows[1]);
  EXPECT_EQ(ds[0], ds[1]);
  EXPECT_GT(ref, 0.0);
}

}  // namespace

TEST(GpuBalance, LossAndScoreGradientMatchCpu) {
  run_case(/*B=*/3, /*T=*/50, /*E=*/16, /*K=*/4, /*alpha=*/0.3, 5);
  run_case(/*B=*/1, /*T=*/700, /*E=*/300, /*K=*/8, /*alpha=*/1e-4, 6);  // more experts than one block's threads
  run_case(/*B=*/4, /*T=*/1, /*E=*/8, /*K=*/8, /*alpha=*/1.0, 7);       // every expert selected: zero gradient
}
