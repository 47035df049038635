// The training forward's LM-head gradient (HeadMode::LossAndGrad: the CE gradient formed in the forward, row
// blocks of full-vocabulary logits, no recompute in backward) against the loss-only forward + recomputing
// backward, on the tiny GPU config with packed documents and unlabelled positions: the same loss, the same
// gradient for every parameter (up to rare bf16 rounding flips of dlogits); the same in stage-step mode (micro-
// batches accumulated under begin_step, which always forms the head gradient in the forward); zero_grads()
// between a training forward and its backward is refused (it would drop the head gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "core/error.h"
#include "model/cuda/gpu_model.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using Grads = std::map<std::string, std::vector<float>>;

constexpr int64_t kS = 64;

struct Batch {
  std::vector<int32_t> ids, labels;
};

Batch make_batch(int64_t V) {
  Batch b;
  std::mt19937 g(17);
  b.ids.resize(size_t(2 * kS));
  b.labels.resize(b.ids.size());
  for (size_t i = 0; i < b.ids.size(); ++i) {
    b.ids[i] = int32_t(g() % uint32_t(V));
    b.labels[i] = (i % 11 == 3) ? -100 : b.ids[i];
  }
  return b;
}

dsv4gpu::GpuModelOptions small_blocks() {
  dsv4gpu::GpuModelOptions o;
  o.lm_chunk = 100;  // ragged vocabulary chunks (256 = 100 + 100 + 56) on the recompute path
  o.lm_rows = 32;       // training path: logits blocks of 32 rows inside
  o.lm_grad_rows = 80;  // dW groups of 80 rows (128 = [32 32 16] + [32 16]; micro-batches of 64: [32 32])
  return o;
}

Grads grads_of(const dsv4gpu::GpuModel& m) {
  Grads g;
  for (const std::string& n : m.param_names()) g[n] = m.grad(n);
  return g;
}

// Per tensor and over all tensors: relative L2 of got against ref; returns the overall error.
double compare(const Grads& got, const Grads& ref, double per_tensor, const char* what) {
  double num = 0, den = 0;
  for (const auto& [name, r] : ref) {
    const std::vector<float>& g = got.at(name);
    double tn = 0, td = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_TRUE(std::isfinite(g[i])) << what << ": " << name << "[" << i << "]";
      tn += (double(g[i]) - r[i]) * (double(g[i]) - r[i]);
      td += double(r[i]) * r[i];
    }
    num += tn, den += td;
    if (td == 0) {
      EXPECT_EQ(tn, 0.0) << what << ": " << name;
      continue;
    }
    // Tensors of a few elements are sums with heavy cancellation: absolute noise, not a relative one.
    if (r.size() >= 64) {
      EXPECT_LT(std::sqrt(tn / td), per_tensor) << what << ": " << name;
    }
  }
  return std::sqrt(num / den);
}

TEST(HeadGradGpu, TrainingForwardMatchesRecomputingBackward) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("head grad test");
  const Batch bt = make_batch(cfg.vocab_size);
  const dsv4::SeqLayout layout = dsv4::SeqLayout::packed(kS, {{kS}, {40, 24}});
  dsv4gpu::GpuModel gpu(cfg, small_blocks());
  gpu.init_random(3);

  gpu.zero_grads();
  const double loss_ref = gpu.forward(bt.ids.data(), bt.labels.data(), layout);  // HeadMode::Loss
  gpu.zero_grads();  // allowed: a loss-only forward leaves no gradient behind
  gpu.backward();
  const Grads ref = grads_of(gpu);

  gpu.zero_grads();
  const double loss = gpu.forward(bt.ids.data(), bt.labels.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
  EXPECT_THROW(gpu.zero_grads(), Error);  // would drop the head gradient the forward just accumulated
  // Before backward: head.weight's gradient is already there, and equals the recompute path's.
  const std::vector<float> head_early = gpu.grad("head.weight");
  gpu.backward();
  const Grads got = grads_of(gpu);
  std::printf("loss: loss-only forward %.7f, training forward %.7f\n", loss_ref, loss);
  EXPECT_NEAR(loss, loss_ref, 1e-6 * std::abs(loss_ref));
  EXPECT_EQ(head_early, got.at("head.weight")) << "backward must not add to the head gradient again";
  // The head's own gradients (head.weight; norm.weight, the first fp32 step from d(normed)) agree to fp32
  // summation order: one K = vocab dX GEMM per row block vs partial sums over vocabulary chunks, and rare bf16
  // rounding flips of dlogits. Below the head those ~1e-7 differences of d(normed) reach the layers' bf16
  // casts and grow to bf16-level noise (2.9e-3 over all tensors on an H200, like micro-batching's 2.7e-3).
  const Grads head_only{{"head.weight", ref.at("head.weight")}, {"norm.weight", ref.at("norm.weight")}};
  const double e_head = compare(got, head_only, 1e-4, "training forward, head");
  std::printf("head.weight + norm.weight gradients rel L2 %.2e (training forward vs recompute)\n", e_head);
  EXPECT_LT(e_head, 1e-4);
  const double e = compare(got, ref, 1e-2, "training forward");
  std::printf("all gradients rel L2 %.2e (training forward vs recompute)\n", e);
  EXPECT_LT(e, 1e-2);

  // A second backward recomputes the logits and accumulates once more, as after a loss-only forward.
  gpu.backward();
  const std::vector<float> twice = gpu.grad("head.weight");
  double num = 0, den = 0;
  for (size_t i = 0; i < twice.size(); ++i) {
    const double r = 2.0 * ref.at("head.weight")[i];
    num += (twice[i] - r) * (twice[i] - r), den += r * r;
  }
  EXPECT_LT(std::sqrt(num / den), 2e-3);
  gpu.zero_grads();  // the gradient was consumed: allowed again
}

TEST(HeadGradGpu, StepModeAccumulatesMicroBatchesLikeOneBatch) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("head grad test");
  const Batch bt = make_batch(cfg.vocab_size);
  int64_t targets = 0;  // next-token targets: position t of a sequence is labelled by label t + 1
  for (int64_t i = 0; i < 2 * kS; ++i) targets += (i % kS != kS - 1) && bt.labels[size_t(i + 1)] >= 0;
  dsv4gpu::GpuModelOptions o = small_blocks();
  o.stage_slots = 2;
  dsv4gpu::GpuModel gpu(cfg, o);
  gpu.init_random(5);

  gpu.zero_grads();
  const double whole = gpu.forward(bt.ids.data(), bt.labels.data(), dsv4::SeqLayout::unpacked(2, kS));
  gpu.backward();
  const Grads ref = grads_of(gpu);

  gpu.zero_grads();
  gpu.begin_step(targets);
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(1, kS);
  // Both forwards first (two slots in flight, each with its own kept d(normed)), then both backwards.
  double loss = gpu.forward_stage(0, bt.ids.data(), bt.labels.data(), mb, nullptr);
  loss += gpu.forward_stage(1, bt.ids.data() + kS, bt.labels.data() + kS, mb, nullptr);
  EXPECT_THROW(gpu.zero_grads(), Error);
  gpu.backward_stage(1, nullptr);
  gpu.backward_stage(0, nullptr);
  std::printf("loss: whole batch %.7f, two micro-batches %.7f\n", whole, loss);
  EXPECT_NEAR(loss, whole, 1e-3 * std::abs(whole));
  const double e = compare(grads_of(gpu), ref, 5e-2, "step mode");
  std::printf("all gradients rel L2 %.2e (micro-batches with the training forward vs one batch)\n", e);
  EXPECT_LT(e, 1e-2);
  gpu.zero_grads();
}

}  // namespace
