// Data parallel (ZeRO-1) training of the GPU model on two GPUs, one thread per rank: the losses of three AdamW
// steps match one GPU training on the concatenated batch (the loss is normalised over the targets of the whole
// DP batch, so ranks with different numbers of labelled targets still give the single-GPU number), and the two
// ranks hold identical parameters afterwards (the all-gathered bf16 weights and the replicated fp32 ones).
// Needs 2 GPUs (skipped with a message otherwise).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comm/nccl_communicator.h"
#include "comm/two_rank_threads.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

dsv4::ModelConfig dp_config() { return trex::testing::tiny_gpu_config("dp test config"); }

constexpr int64_t kS = 64;
constexpr int kSteps = 3;

// Two sequences: one document of 64 tokens, and two documents (40 + 24) with some unlabelled positions, so the
// ranks see different numbers of targets.
struct GlobalBatch {
  std::vector<int32_t> ids, labels;
  std::vector<std::vector<int64_t>> docs{{kS}, {40, 24}};
};

GlobalBatch make_batch(int64_t V) {
  GlobalBatch b;
  std::mt19937 g(7);
  b.ids.resize(size_t(2 * kS));
  b.labels.resize(b.ids.size());
  for (size_t i = 0; i < b.ids.size(); ++i) {
    b.ids[i] = int32_t(g() % uint32_t(V));
    b.labels[i] = (i >= size_t(kS) && i % 5 == 2) ? -100 : b.ids[i];
  }
  return b;
}

std::vector<double> train(dsv4gpu::GpuModel& m, const int32_t* ids, const int32_t* labels,
                          const dsv4::SeqLayout& lay) {
  std::vector<double> losses;
  dsv4gpu::GpuOptimizer opt(m);
  cuda::AdamWStep a;
  a.lr = 1e-3, a.weight_decay = 0.1;
  for (int s = 1; s <= kSteps; ++s) {
    losses.push_back(m.forward(ids, labels, lay));
    m.zero_grads();
    m.backward();
    a.step = s;
    opt.adamw_step(a);
  }
  return losses;
}

TEST(DataParallelGpu, Zero1MatchesOneGpuOnTheSameGlobalBatch) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 2) GTEST_SKIP() << "needs 2 GPUs, " << n_dev << " visible";
  const dsv4::ModelConfig cfg = dp_config();
  const GlobalBatch gb = make_batch(cfg.vocab_size);

  std::vector<double> ref;
  {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    dsv4gpu::GpuModel one(cfg);
    one.init_random(5);
    ref = train(one, gb.ids.data(), gb.labels.data(), dsv4::SeqLayout::packed(kS, gb.docs));
  }

  const comm::NcclId id = comm::nccl_new_id();
  std::vector<double> losses[2];
  std::vector<std::vector<float>> values[2];
  std::vector<std::string> names;
  trex::testing::run2([&](int r) {
    auto c = comm::make_nccl_communicator(id, r, 2, r, 120);
    dsv4gpu::GpuModelOptions o;
    o.dp = c.get();
    dsv4gpu::GpuModel m(cfg, o);
    m.init_random(5);
    const size_t off = size_t(r) * kS;
    losses[r] = train(m, gb.ids.data() + off, gb.labels.data() + off, dsv4::SeqLayout::packed(kS, {gb.docs[r]}));
    for (const std::string& n : m.param_names()) values[r].push_back(m.value(n));
    if (r == 0) names = m.param_names();
  });
  if (HasFatalFailure()) return;  // a rank threw: its message is the failure
  for (int s = 0; s < kSteps; ++s) {
    std::printf("step %d: loss one GPU %.6f, DP rank 0 %.6f, rank 1 %.6f\n", s + 1, ref[size_t(s)],
                losses[0][size_t(s)], losses[1][size_t(s)]);
    EXPECT_EQ(losses[0][size_t(s)], losses[1][size_t(s)]) << "the ranks report different global losses";
    // bf16 activations with different GEMM shapes (M = 64 vs 128): rounding-level differences only.
    const double tol = (s == 0 ? 1e-3 : 5e-3) * std::abs(ref[size_t(s)]);
    EXPECT_NEAR(losses[0][size_t(s)], ref[size_t(s)], tol) << "step " << s + 1;
  }
  EXPECT_LT(ref.back(), ref.front()) << "training did not lower the loss";
  ASSERT_EQ(values[0].size(), values[1].size());
  for (size_t i = 0; i < names.size(); ++i)
    ASSERT_EQ(values[0][i], values[1][i]) << "parameter " << names[i] << " differs between the DP ranks";
}

}  // namespace
