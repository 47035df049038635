// The clipping norm under tensor x data parallelism at every ZeRO level (GpuModel::dp_grad_norm, under TP
// GpuModel::Impl::tp_grad_norm), on the model alone: tp=2 x dp=2 (4 ranks as threads on ONE GPU over the
// thread-group communicator), one backward per DP rank of that rank's batch on the same weights, under zero 1, 2
// and 3, against tp=1 x dp=2 zero 1 on the same two batches.
// - zero 2 and zero 3 against zero 1 of the layout: one backward's gradients are the same sums at every level (the
//   same bf16 weight bits, ZeRO-3's gathered from the slices; two DP ranks, so each reduced element is a + b, one
//   rounding whatever the order) and the norm sums them over the same ranges, so the norms are the same bits up
//   to the sum-of-squares kernel's block split: rel 1e-6. Under ZeRO-2 / ZeRO-3 the gradient array is compact
//   ([region X | the own bucket slices | region R], GpuModel::Impl::grad_index): a norm that reads it at the
//   whole-arena offsets sums other slices and memory past the array's end, off by O(1) and different from run
//   to run;
// - every rank's norm is the same bits (clipping scales every rank's gradients by it);
// - zero 1 against tp=1: the TP rounding only (TpGpu's bound for the norm, test_tp_gpu.cpp: rel 1e-2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "comm/two_rank_threads.h"
#include "model/cuda/gpu_model.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

// DP rank d's batch: two rows of 64 tokens, one of them two packed documents; some labels masked (-1).
struct Batch {
  std::vector<int32_t> ids, labels;
  int64_t targets = 0;
};
Batch batch(int64_t V, int d) {
  std::mt19937 g(11 + uint32_t(d));
  Batch b;
  b.ids.resize(128), b.labels.resize(128);
  for (size_t i = 0; i < 128; ++i) {
    b.ids[i] = int32_t(g() % uint32_t(V));
    b.labels[i] = (i % 11 == 3) ? -1 : b.ids[i];
    b.targets += b.labels[i] >= 0;
  }
  return b;
}
dsv4::SeqLayout layout() { return dsv4::SeqLayout::packed(64, {{64}, {40, 24}}); }

// This rank's norm after one backward of its DP rank's batch (the engine's data-parallel micro-batch path:
// begin_step with the global targets, forward_stage / backward_stage reduce-scattering as backward completes).
double one_backward_norm(const dsv4::ModelConfig& cfg, comm::Communicator* dp, comm::Communicator* tp, int zero) {
  dsv4gpu::GpuModelOptions o;
  o.dp = dp;
  o.tp = tp;
  o.zero = zero;
  o.deterministic = true;
  dsv4gpu::GpuModel m(cfg, o);
  m.init_random(5);
  const Batch mine = batch(cfg.vocab_size, dp->rank());
  int64_t targets = 0;
  for (int d = 0; d < dp->size(); ++d) targets += batch(cfg.vocab_size, d).targets;
  m.zero_grads();
  m.begin_step(targets, -1, dp->size());
  m.forward_stage(0, mine.ids.data(), mine.labels.data(), layout(), nullptr);
  m.backward_stage(0, nullptr);
  return m.dp_grad_norm();
}

}  // namespace

TEST(TpZeroNormGpu, EveryZeroLevelGivesZeroOnesNorm) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("TP x ZeRO norm test config");
  const int T = 2, D = 2;

  // tp=1 x dp=2, zero 1: the reference.
  std::vector<double> ref(static_cast<size_t>(D));
  {
    auto world = comm::make_thread_group(D, 120.0);
    trex::testing::run_ranks(D, [&](int r) {
      ref[size_t(r)] = one_backward_norm(cfg, world[size_t(r)].get(), nullptr, 1);
    });
  }
  if (HasFailure()) return;
  EXPECT_EQ(ref[0], ref[1]) << "tp=1 x dp=2: the DP ranks' norms differ";

  // tp=2 x dp=2 (TP innermost, as parallel::build_mesh: world rank = dp_rank * T + tp_rank), zero 1, 2, 3 in turn.
  std::vector<std::vector<double>> norm(4, std::vector<double>(static_cast<size_t>(T * D)));
  {
    auto world = comm::make_thread_group(T * D, 120.0);
    trex::testing::run_ranks(T * D, [&](int w) {
      comm::Communicator& c = *world[size_t(w)];
      const std::unique_ptr<comm::Communicator> dp = c.split(w % T, w / T), tp = c.split(w / T, w % T);
      for (int zero = 1; zero <= 3; ++zero)
        norm[size_t(zero)][size_t(w)] = one_backward_norm(cfg, dp.get(), tp.get(), zero);
    });
  }
  if (HasFailure()) return;
  for (int zero = 1; zero <= 3; ++zero) {
    const std::vector<double>& n = norm[size_t(zero)];
    std::printf("tp=2 x dp=2 zero %d: norm %.9g %.9g %.9g %.9g (world ranks 0..3); tp=1 x dp=2 zero 1: %.9g\n", zero,
                n[0], n[1], n[2], n[3], ref[0]);
    for (int w = 1; w < T * D; ++w)
      EXPECT_EQ(n[size_t(w)], n[0]) << "zero " << zero << ": world rank " << w << "'s norm vs rank 0's";
    if (zero > 1) {
      const double z1 = norm[1][0];
      EXPECT_LE(std::abs(n[0] - z1) / z1, 1e-6) << "zero " << zero << "'s norm " << n[0] << " vs zero 1's " << z1
                                                << " on the same gradients: read from the wrong place?";
      std::printf("  zero %d %s zero 1's\n", zero, n[0] == z1 ? "bit-identical to" : "differs from");
    }
  }
  EXPECT_LE(std::abs(norm[1][0] - ref[0]) / ref[0], 1e-2) << "tp=2 x dp=2 zero 1's norm " << norm[1][0]
                                                          << " vs tp=1 x dp=2's " << ref[0];
}
