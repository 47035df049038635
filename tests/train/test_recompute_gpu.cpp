// Activation recomputation of the GPU model (GpuModelOptions::recompute): selective and full give the loss, the
// router / indexer selections and the gradients of recompute none, keep the activation bytes the activation table
// plans (activation_plan.h), and full keeps (and peaks at) less than none. Whole model with the MTP module and the
// balance loss, and pipeline stage steps with two micro-batches in flight.
//
// Bit-identical means memcmp of the fp32 gradients. The models run with GpuModelOptions::deterministic (the sparse
// attention backward sums dK / dV in a fixed order instead of with fp32 atomics; every other kernel is deterministic
// already), so recompute none reproduces every gradient bit for bit and each mode must equal it exactly. The
// comparison still runs none twice and would report (and fail on) any tensor none itself does not reproduce.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/gpu_model.h"
#include "train/gpu_mesh_test_support.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using dsv4::Recompute;
using Grads = std::map<std::string, std::vector<float>>;

cudaMemPool_t default_pool() {
  cudaMemPool_t pool;
  int dev = 0;
  EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
  EXPECT_EQ(cudaDeviceGetDefaultMemPool(&pool, dev), cudaSuccess);
  return pool;
}
void reset_peak() {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  uint64_t zero = 0;
  EXPECT_EQ(cudaMemPoolSetAttribute(default_pool(), cudaMemPoolAttrUsedMemHigh, &zero), cudaSuccess);
}
uint64_t peak() {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  uint64_t high = 0;
  EXPECT_EQ(cudaMemPoolGetAttribute(default_pool(), cudaMemPoolAttrUsedMemHigh, &high), cudaSuccess);
  return high;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) n += double(a[i] - ref[i]) * (a[i] - ref[i]), d += double(ref[i]) * ref[i];
  return std::sqrt(n / std::max(d, 1e-30));
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const char* name(Recompute r) { return dsv4::to_string(r); }

// `mode`'s gradients against none's (ref), with none's second run (ref2) saying which tensors none reproduces.
void expect_gradients_of_none(const Grads& ref, const Grads& ref2, const Grads& got, Recompute mode) {
  int exact = 0, tolerated = 0;
  double worst = 0, worst_none = 0;
  for (const auto& [n, g] : ref) {
    ASSERT_TRUE(got.count(n) && ref2.count(n)) << n;
    const std::vector<float>& x = got.at(n);
    if (same_bits(g, ref2.at(n))) {
      EXPECT_TRUE(same_bits(g, x)) << name(mode) << ": " << n << " differs from none's (rel L2 " << rel_l2(x, g)
                                   << "), which none reproduces bit for bit";
      ++exact;
    } else {  // none itself does not reproduce it: a nondeterministic kernel on the deterministic path
      const double e = rel_l2(x, g), e_none = rel_l2(ref2.at(n), g);
      worst = std::max(worst, e), worst_none = std::max(worst_none, e_none);
      EXPECT_LT(e, 1e-2) << name(mode) << ": " << n << " (none vs none: " << e_none << ")";
      ++tolerated;
    }
  }
  std::printf("recompute %-9s: %d tensors bit-identical to none, %d fed by atomics within rel L2 %.2e (none vs "
              "none up to %.2e)\n", name(mode), exact, tolerated, worst, worst_none);
  EXPECT_EQ(tolerated, 0) << "with GpuModelOptions::deterministic none reproduces every gradient";
  EXPECT_GT(exact, 10);
}

// ---- whole model (MTP module, balance loss) ----

struct StepRun {
  double loss = 0;
  Grads grads;
  std::vector<std::vector<int32_t>> router;
  std::vector<std::vector<int64_t>> csa;
  dsv4gpu::GpuModel::ActivationBytes after_forward, after_backward;
  dsv4gpu::ActivationPlan plan;
  uint64_t peak = 0;
};

StepRun whole_model_step(const dsv4::ModelConfig& cfg, Recompute mode, const std::vector<int32_t>& ids,
                     const std::vector<int32_t>& labels, const dsv4::SeqLayout& layout, int64_t full_layers = -1) {
  dsv4gpu::GpuModelOptions o;
  o.deterministic = true;
  o.recompute = mode;
  o.recompute_full_layers = full_layers;
  o.balance_alpha = 1e-3;  // the replay recomputes its gradient
  o.mtp_weight = 0.3;
  dsv4gpu::GpuModel m(cfg, o);
  m.init_random(17);
  m.zero_grads();
  StepRun r;
  reset_peak();
  r.loss = m.forward(ids.data(), labels.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad);
  r.after_forward = m.activation_bytes();
  m.backward();
  r.peak = peak();
  r.after_backward = m.activation_bytes();
  r.plan = m.activation_plan(layout);
  for (const std::string& n : m.param_names()) r.grads[n] = m.grad(n);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {  // read after the backward: the replays re-used them
    r.router.push_back(m.router_selection(l));
    if (cfg.attn_types[size_t(l)] == dsv4::AttnType::CSA) r.csa.push_back(m.csa_selection(l));
  }
  return r;
}

// Random token ids of two packed rows (one whole sequence, then two documents), every `every`-th label masked.
struct Batch {
  dsv4::SeqLayout layout;
  std::vector<int32_t> ids, labels;
};
Batch random_batch(const dsv4::ModelConfig& cfg, uint32_t seed, size_t every, size_t at) {
  const int64_t S = 128;
  Batch b{dsv4::SeqLayout::packed(S, {{S}, {80, 48}}), {}, {}};
  std::mt19937 g(seed);
  b.ids.resize(static_cast<size_t>(b.layout.n_tokens())), b.labels.resize(b.ids.size());
  for (size_t i = 0; i < b.ids.size(); ++i) {
    b.ids[i] = int32_t(g() % uint32_t(cfg.vocab_size));
    b.labels[i] = (i % every == at) ? -100 : b.ids[i];
  }
  return b;
}

TEST(RecomputeGpu, SelectiveAndFullGiveNonesLossSelectionsAndGradientsWithTheMtpModule) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("recompute test config", 1);
  const Batch batch = random_batch(cfg, 5, 9, 4);
  const dsv4::SeqLayout& layout = batch.layout;
  const std::vector<int32_t>&ids = batch.ids, &labels = batch.labels;
  const StepRun none = whole_model_step(cfg, Recompute::None, ids, labels, layout);
  const StepRun none2 = whole_model_step(cfg, Recompute::None, ids, labels, layout);
  ASSERT_TRUE(std::isfinite(none.loss));
  EXPECT_EQ(none.after_forward.kept, none.plan.kept()) << "the activation table against the pools";
  EXPECT_EQ(none.plan.block_scratch, 0);
  EXPECT_EQ(none.after_backward.block_peak, 0);
  std::map<Recompute, StepRun> runs;
  for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
    const StepRun r = whole_model_step(cfg, mode, ids, labels, layout);
    EXPECT_EQ(r.loss, none.loss) << name(mode);  // the forward is the same kernels on the same inputs
    EXPECT_EQ(r.router, none.router) << name(mode);
    EXPECT_EQ(r.csa, none.csa) << name(mode);
    expect_gradients_of_none(none.grads, none2.grads, r.grads, mode);
    // What the pools hold after the forward, and the largest one block's rebuilt activations, as planned.
    EXPECT_EQ(r.after_forward.kept, r.plan.kept()) << name(mode);
    EXPECT_EQ(r.after_backward.block_peak, r.plan.block_scratch) << name(mode);
    EXPECT_GT(r.plan.block_scratch, 0) << name(mode);
    EXPECT_LT(r.plan.total(), none.plan.total()) << name(mode);
    EXPECT_LT(r.peak, none.peak) << name(mode) << ": the device pool's high-water mark of the step";
    std::printf("recompute %-9s: planned activations %.2f MB (kept %.2f + one block %.2f), measured kept %.2f MB; "
                "step peak %.2f MB (none: planned %.2f, peak %.2f)\n", name(mode), r.plan.total() / 1e6,
                r.plan.kept() / 1e6, r.plan.block_scratch / 1e6, r.after_forward.kept / 1e6, r.peak / 1e6,
                none.plan.total() / 1e6, none.peak / 1e6);
    runs[mode] = r;
  }
  EXPECT_LT(runs[Recompute::Full].plan.total(), runs[Recompute::Selective].plan.total());
  // Full keeps each block's input stream and selections only (a small fraction of a block's activations): what it
  // keeps across the step is at most none's non-block activations plus a tenth of none's block activations, and
  // its one replayed block's scratch is of the order of the largest block.
  int64_t none_blocks = 0, largest = 0;
  for (const auto& b : none.plan.blocks) none_blocks += b.kept, largest = std::max(largest, b.kept);
  EXPECT_LE(runs[Recompute::Full].plan.kept(), none.plan.kept() - none_blocks + none_blocks / 10);
  EXPECT_LE(runs[Recompute::Full].plan.block_scratch, 2 * largest);
}

// Full recomputation of the first layer only (recompute_full_layers 1): that block replays, the later ones and the
// MTP block recompute selectively. The same loss, selections and gradients as none, the activation table's bytes,
// and a plan between full's and selective's.
TEST(RecomputeGpu, FullOnTheFirstLayersOnlyGivesNonesGradientsAndPlansBetweenFullAndSelective) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("recompute test config", 1);
  ASSERT_GE(cfg.n_layers, 2) << "the test needs a layer replayed in full and one recomputed selectively";
  const Batch batch = random_batch(cfg, 7, 7, 3);
  const dsv4::SeqLayout& layout = batch.layout;
  const std::vector<int32_t>&ids = batch.ids, &labels = batch.labels;
  const StepRun none = whole_model_step(cfg, Recompute::None, ids, labels, layout);
  const StepRun none2 = whole_model_step(cfg, Recompute::None, ids, labels, layout);
  const StepRun sel = whole_model_step(cfg, Recompute::Selective, ids, labels, layout);
  const StepRun full = whole_model_step(cfg, Recompute::Full, ids, labels, layout);
  const StepRun mixed = whole_model_step(cfg, Recompute::Full, ids, labels, layout, 1);
  EXPECT_EQ(mixed.loss, none.loss);
  EXPECT_EQ(mixed.router, none.router);
  EXPECT_EQ(mixed.csa, none.csa);
  expect_gradients_of_none(none.grads, none2.grads, mixed.grads, Recompute::Full);
  EXPECT_EQ(mixed.after_forward.kept, mixed.plan.kept()) << "the activation table against the pools";
  EXPECT_EQ(mixed.after_backward.block_peak, mixed.plan.block_scratch);
  // Block 0 keeps full's (its input stream), the others selective's.
  ASSERT_EQ(mixed.plan.blocks.size(), sel.plan.blocks.size());
  EXPECT_EQ(mixed.plan.blocks[0].kept, full.plan.blocks[0].kept);
  for (size_t b = 1; b < mixed.plan.blocks.size(); ++b) EXPECT_EQ(mixed.plan.blocks[b].kept, sel.plan.blocks[b].kept) << b;
  EXPECT_LT(mixed.plan.kept(), sel.plan.kept());
  EXPECT_GT(mixed.plan.kept(), full.plan.kept());
  std::printf("recompute full on layer 0 only: kept %.2f MB (full %.2f, selective %.2f), one block %.2f MB\n",
              mixed.plan.kept() / 1e6, full.plan.kept() / 1e6, sel.plan.kept() / 1e6, mixed.plan.block_scratch / 1e6);
}

// ---- pipeline stage steps: the first stage (layers [0, 2)), two micro-batches in flight ----

struct StageRun {
  std::vector<std::vector<uint16_t>> out;  // bf16 stage outputs per micro-batch
  Grads grads;
  int64_t kept = 0;
  dsv4gpu::ActivationPlan plan;
};

StageRun stage_steps(const dsv4::ModelConfig& cfg, Recompute mode, const std::vector<int32_t>& ids,
                     const std::vector<float>& dx, const dsv4::SeqLayout& mb) {
  dsv4gpu::GpuModelOptions o;
  o.deterministic = true;
  o.recompute = mode;
  o.layer_begin = 0, o.layer_end = 2, o.stage_slots = 2;
  dsv4gpu::GpuModel m(cfg, o);
  m.init_random(23);
  m.zero_grads();
  m.begin_step(0);
  const int64_t N = mb.n_tokens(), n = m.stream_elems(mb);
  StageRun r;
  float* d_dx = nullptr;
  EXPECT_EQ(cudaMalloc(&d_dx, size_t(2 * n) * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_dx, dx.data(), size_t(2 * n) * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  for (int64_t k = 0; k < 2; ++k) m.forward_stage(k, ids.data() + k * N, nullptr, mb, nullptr);
  r.kept = m.activation_bytes().kept;  // both slots' activations
  r.plan = m.activation_plan(mb);
  for (int64_t k = 0; k < 2; ++k) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    EXPECT_EQ(cudaMemcpy(v.data(), m.stage_output(k), v.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    r.out.push_back(std::move(v));
  }
  m.backward_stage(1, d_dx + n);  // 1F1B order: the later micro-batch first
  m.backward_stage(0, d_dx);
  for (const std::string& nm : m.param_names()) r.grads[nm] = m.grad(nm);
  cudaFree(d_dx);
  return r;
}

TEST(RecomputeGpu, StageStepsWithTwoMicroBatchesInFlightGiveNonesOutputsAndGradients) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("recompute stage config");
  const dsv4::SeqLayout mb = dsv4::SeqLayout::packed(64, {{40, 24}});
  const trex::testing::TwoMicroBatchStageInputs in = trex::testing::two_micro_batch_stage_inputs(cfg, mb, 8);
  const std::vector<int32_t>& ids = in.ids;
  const std::vector<float>& dx = in.dx;
  const StageRun none = stage_steps(cfg, Recompute::None, ids, dx, mb);
  const StageRun none2 = stage_steps(cfg, Recompute::None, ids, dx, mb);
  EXPECT_EQ(none.kept, 2 * none.plan.kept());
  for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
    const StageRun r = stage_steps(cfg, mode, ids, dx, mb);
    EXPECT_EQ(r.out, none.out) << name(mode) << ": the stage outputs";
    EXPECT_EQ(r.kept, 2 * r.plan.kept()) << name(mode);
    EXPECT_LT(r.kept, none.kept) << name(mode);
    expect_gradients_of_none(none.grads, none2.grads, r.grads, mode);
  }
}

}  // namespace
