// Pipeline parallel (PP = 2, 1F1B, 4 micro-batches) training of the GPU model on two GPUs, one thread per stage:
// the step losses and every parameter's gradient (by name) match one GPU accumulating the same micro-batches in
// order, and that one-GPU accumulation matches a plain forward over the concatenated batch. The stages allocate
// only their own parameters (together: the full model's names, each once). Needs 2 GPUs (skipped otherwise).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "comm/nccl_communicator.h"
#include "comm/two_rank_threads.h"
#include "model/cuda/gpu_model.h"
#include "train/cuda/gpu_optimizer.h"
#include "train/cuda/gpu_pipeline.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

dsv4::ModelConfig pp_config() { return trex::testing::tiny_gpu_config("pp test config"); }

constexpr int64_t kS = 64, kM = 4;
constexpr int kSteps = 2;

using Grads = std::map<std::string, std::vector<float>>;

struct StepRun {
  std::vector<double> losses;
  Grads grads;  // after step 1
};

// M micro-batches of one 64-token sequence; some unlabelled positions, differently many per micro-batch.
void make_batch(int64_t V, std::vector<int32_t>& ids, std::vector<int32_t>& labels) {
  std::mt19937 g(11);
  ids.resize(size_t(kM * kS));
  labels.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(g() % uint32_t(V));
    const int64_t m = int64_t(i) / kS;
    labels[i] = (m > 0 && int64_t(i) % (3 + m) == 1) ? -100 : ids[i];
  }
}

cuda::AdamWStep adamw(int s) {
  cuda::AdamWStep a;
  a.lr = 1e-3, a.weight_decay = 0.1, a.step = s;
  return a;
}

void keep_grads(const dsv4gpu::GpuModel& m, Grads& into) {
  for (const std::string& n : m.param_names()) into[n] = m.grad(n);
}

TEST(PipelineGpu, OneFOneBMatchesOneGpuAccumulatingTheMicroBatches) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 2) GTEST_SKIP() << "needs 2 GPUs, " << n_dev << " visible";
  const dsv4::ModelConfig cfg = pp_config();
  std::vector<int32_t> ids, labels;
  make_batch(cfg.vocab_size, ids, labels);
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(1, kS);
  int64_t targets = 0;
  for (int64_t i = 0; i < kM * kS; ++i) targets += (i % kS != kS - 1) && labels[size_t(i + 1)] >= 0;

  // One GPU: the same micro-batches one after the other, gradients accumulated.
  StepRun ref;
  double whole = 0;
  int64_t full_params = 0;
  {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    dsv4gpu::GpuModel one(cfg);
    dsv4gpu::GpuOptimizer one_opt(one);
    one.init_random(5);
    full_params = one.n_params();
    whole = one.forward(ids.data(), labels.data(), dsv4::SeqLayout::unpacked(kM, kS));
    for (int s = 1; s <= kSteps; ++s) {
      one.zero_grads();
      one.begin_step(targets);
      double loss = 0;
      for (int64_t m = 0; m < kM; ++m) {
        loss += one.forward_stage(m, ids.data() + m * kS, labels.data() + m * kS, mb, nullptr);
        one.backward_stage(m, nullptr);
      }
      ref.losses.push_back(loss);
      if (s == 1) keep_grads(one, ref.grads);
      one_opt.adamw_step(adamw(s));
    }
  }
  std::printf("loss: one forward over the batch %.6f, one GPU accumulating %lld micro-batches %.6f\n", whole,
              static_cast<long long>(kM), ref.losses[0]);
  EXPECT_NEAR(ref.losses[0], whole, 1e-3 * std::abs(whole)) << "micro-batch accumulation != the whole batch";

  const comm::NcclId id_act = comm::nccl_new_id(), id_grad = comm::nccl_new_id();
  StepRun pp[2];
  int64_t stage_params[2] = {0, 0};
  trex::testing::run2([&](int r) {
    auto act = comm::make_nccl_communicator(id_act, r, 2, r, 30);  // fail fast, not hang
    auto grad = comm::make_nccl_communicator(id_grad, r, 2, r, 30);
    dsv4gpu::GpuModelOptions o;
    o.layer_begin = r == 0 ? 0 : 2, o.layer_end = r == 0 ? 2 : 3;
    o.stage_slots = 2 - r;
    dsv4gpu::GpuModel m(cfg, o);
    dsv4gpu::GpuOptimizer m_opt(m);
    m.init_random(5);
    stage_params[r] = m.n_params();
    dsv4gpu::GpuPipeline pipe(m, *act, *grad, kM);
    std::vector<double> local;
    for (int s = 1; s <= kSteps; ++s) {
      m.zero_grads();
      local.push_back(pipe.step(ids.data(), labels.data(), mb));
      if (s == 1) keep_grads(m, pp[r].grads);
      m_opt.adamw_step(adamw(s));
    }
    pp[r].losses = pipe.global_losses(local);
  });
  if (HasFatalFailure()) return;  // a rank threw: its message is the failure
  EXPECT_EQ(stage_params[0] + stage_params[1], full_params) << "the stages' parameters do not add up to the model";
  EXPECT_LT(stage_params[0], full_params);
  EXPECT_LT(stage_params[1], full_params);
  for (int s = 0; s < kSteps; ++s) {
    std::printf("step %d: loss one GPU %.6f, PP stage 0 %.6f, stage 1 %.6f\n", s + 1, ref.losses[size_t(s)],
                pp[0].losses[size_t(s)], pp[1].losses[size_t(s)]);
    EXPECT_EQ(pp[0].losses[size_t(s)], pp[1].losses[size_t(s)]) << "the stages report different losses";
    // Same kernels on the same shapes: only atomics-order / bf16 rounding-level differences (after an AdamW
    // step those reach the loss a little more: near-zero gradients are normalised by sqrt(v)).
    const double tol = (s == 0 ? 1e-4 : 2e-3) * std::abs(ref.losses[size_t(s)]);
    EXPECT_NEAR(pp[1].losses[size_t(s)], ref.losses[size_t(s)], tol) << "step " << s + 1;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front()) << "training did not lower the loss";
  // Gradients by name: each parameter on exactly one stage, relative L2 error at bf16 level.
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g_ref] : ref.grads) {
    const int on0 = int(pp[0].grads.count(name)), on1 = int(pp[1].grads.count(name));
    ASSERT_EQ(on0 + on1, 1) << name << " is on " << on0 + on1 << " stages";
    const std::vector<float>& g = (on0 ? pp[0] : pp[1]).grads.at(name);
    ASSERT_EQ(g.size(), g_ref.size()) << name;
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i)
      num += (double(g[i]) - g_ref[i]) * (double(g[i]) - g_ref[i]), den += double(g_ref[i]) * g_ref[i];
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    if (den > 0 && rel > worst) worst = rel, worst_name = name;
    EXPECT_LE(std::sqrt(num), 1e-2 * std::sqrt(den) + 1e-7) << "gradient of " << name << " (stage " << (on0 ? 0 : 1)
                                                             << "): relative L2 error " << rel;
  }
  EXPECT_EQ(pp[0].grads.size() + pp[1].grads.size(), ref.grads.size());
  std::printf("gradients: %zu tensors compared, worst relative L2 error %.3g (%s)\n", ref.grads.size(), worst,
              worst_name.c_str());
}

TEST(PipelineGpu, OneFOneBOrder) {
  // Rank 0 of 2 over 4 micro-batches: one warm-up forward, then F/B pairs, then the last backward.
  EXPECT_EQ(dsv4gpu::GpuPipeline::one_f_one_b(0, 2, 4), (std::vector<int64_t>{1, 2, -1, 3, -2, 4, -3, -4}));
  EXPECT_EQ(dsv4gpu::GpuPipeline::one_f_one_b(1, 2, 4), (std::vector<int64_t>{1, -1, 2, -2, 3, -3, 4, -4}));
}

}  // namespace
