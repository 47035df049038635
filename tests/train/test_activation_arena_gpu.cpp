// The GPU model's activation arena (model/cuda/activation_arena.h): after the first step the second one starts by
// laying the arena out in one allocation, and no later step makes a device allocation
// (cuda::DeviceBuffer::allocations, the count of every device buffer the process makes); the losses, stage
// outputs and gradients are bit for bit those of the same steps without the arena
// (GpuModelOptions::activation_arena off: every activation a device buffer of its own); the arena is at most the
// sum of its regions' peaks and the step's simultaneous peak holds at least the activation table's kept bytes
// (activation_plan.h). Recompute none, selective and full; the whole model with the
// MTP module and the balance loss, and a pipeline stage (layers [0, 2)) with two micro-batches in flight.
//
// Deterministic models (GpuModelOptions::deterministic): the same steps reproduce every bit, so any difference
// between the two runs is the arena's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "model/cuda/gpu_model.h"
#include "train/gpu_mesh_test_support.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;
using dsv4::Recompute;
using Grads = std::map<std::string, std::vector<float>>;

constexpr int kSteps = 4;

int64_t allocations() { return cuda::DeviceBuffer::allocations(); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct StepsRun {
  std::vector<double> losses;                       // per step (whole model)
  std::vector<std::vector<uint16_t>> outputs;       // per step and micro-batch: bf16 stage outputs
  std::vector<int64_t> step_allocations;            // device buffers each step made
  Grads grads;                                      // after the last step
  dsv4gpu::GpuModel::ArenaInfo arena;
  dsv4gpu::ActivationPlan plan;
};

void expect_same(const StepsRun& with, const StepsRun& without, const char* what) {
  EXPECT_EQ(with.losses, without.losses) << what;
  EXPECT_EQ(with.outputs, without.outputs) << what;
  ASSERT_EQ(with.grads.size(), without.grads.size()) << what;
  int same = 0;
  for (const auto& [n, g] : without.grads) {
    ASSERT_TRUE(with.grads.count(n)) << what << ": " << n;
    EXPECT_TRUE(same_bits(with.grads.at(n), g)) << what << ": gradient " << n << " differs with the arena";
    same += same_bits(with.grads.at(n), g);
  }
  EXPECT_GT(same, 10) << what;
}

// Step 1 allocates (it measures), step 2 makes exactly the arena's one allocation, steps 3.. none. The arena is at
// most the sum of its regions' peaks, at least the traced step's simultaneous peak, which holds at least the
// activation table's kept bytes (`table_kept`: all live at once when the forward ends).
void expect_planned_once(const StepsRun& r, int64_t table_kept, const char* what) {
  ASSERT_EQ(r.step_allocations.size(), size_t(kSteps));
  EXPECT_GT(r.step_allocations[0], 0) << what;
  EXPECT_EQ(r.step_allocations[1], 1) << what << ": the second step's only allocation is the arena";
  for (int s = 2; s < kSteps; ++s)
    EXPECT_EQ(r.step_allocations[size_t(s)], 0) << what << ": step " << s + 1 << " allocated";
  EXPECT_EQ(r.arena.plans, 1) << what;
  // Packed when that saves bytes, else stacked: never more than the regions' own peaks one after another.
  EXPECT_LE(r.arena.bytes, r.arena.sum_of_peaks) << what;
  EXPECT_EQ(r.arena.packed, r.arena.bytes < r.arena.sum_of_peaks) << what;
  EXPECT_GE(r.arena.bytes, r.arena.planned_peak_live) << what << ": a layout below the step's simultaneous peak";
  EXPECT_GE(r.arena.planned_peak_live, r.arena.peak_live) << what << ": the last step held more than the traced one";
  EXPECT_GE(r.arena.peak_live, table_kept) << what << ": the step held less than the activation table keeps";
  std::printf("%-28s: step 1 made %lld device buffers, step 2 %lld (the arena, %s, %.2f MB; sum of region "
              "peaks %.2f MB, simultaneous peak %.2f MB, table kept %.2f MB), steps 3-%d %lld\n", what,
              (long long)r.step_allocations[0], (long long)r.step_allocations[1],
              r.arena.packed ? "packed" : "stacked", r.arena.bytes / 1e6,
              r.arena.sum_of_peaks / 1e6, r.arena.peak_live / 1e6, table_kept / 1e6, kSteps,
              (long long)(r.step_allocations[2] + r.step_allocations[3]));
}

// ---- whole model (MTP module, balance loss) ----

StepsRun whole_model(const dsv4::ModelConfig& cfg, Recompute mode, bool arena, const std::vector<int32_t>& ids,
                const std::vector<int32_t>& labels, const dsv4::SeqLayout& layout) {
  dsv4gpu::GpuModelOptions o;
  o.deterministic = true;
  o.recompute = mode;
  o.balance_alpha = 1e-3;
  o.mtp_weight = 0.3;
  o.activation_arena = arena;
  dsv4gpu::GpuModel m(cfg, o);
  m.init_random(17);
  StepsRun r;
  for (int s = 0; s < kSteps; ++s) {
    m.zero_grads();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int64_t before = allocations();
    r.losses.push_back(m.forward(ids.data(), labels.data(), layout, nullptr, dsv4gpu::HeadMode::LossAndGrad));
    m.backward();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    r.step_allocations.push_back(allocations() - before);
  }
  r.arena = m.activation_arena();
  r.plan = m.activation_plan(layout);
  for (const std::string& n : m.param_names()) r.grads[n] = m.grad(n);
  return r;
}

TEST(ActivationArenaGpu, WholeModelStepsAfterThePlanAllocateNothingAndMatchTheStepsWithoutIt) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("arena test config", 1);
  const int64_t S = 128;
  const dsv4::SeqLayout layout = dsv4::SeqLayout::packed(S, {{S}, {80, 48}});
  const int64_t N = layout.n_tokens();
  std::mt19937 g(5);
  std::vector<int32_t> ids(static_cast<size_t>(N)), labels(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(g() % uint32_t(cfg.vocab_size));
    labels[i] = (i % 9 == 4) ? -100 : ids[i];
  }
  for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    const std::string what = std::string("whole model, recompute ") + dsv4::to_string(mode);
    const StepsRun with = whole_model(cfg, mode, true, ids, labels, layout);
    const StepsRun without = whole_model(cfg, mode, false, ids, labels, layout);
    for (double l : with.losses) EXPECT_TRUE(std::isfinite(l)) << what;
    expect_same(with, without, what.c_str());
    expect_planned_once(with, with.plan.kept(), what.c_str());
    EXPECT_EQ(without.arena.plans, 0) << what;
    EXPECT_EQ(without.arena.bytes, 0) << what;
  }
}

// ---- pipeline stage steps: the first stage (layers [0, 2)), two micro-batches in flight ----

StepsRun stage(const dsv4::ModelConfig& cfg, Recompute mode, bool arena, const std::vector<int32_t>& ids,
          const std::vector<float>& dx, const dsv4::SeqLayout& mb) {
  dsv4gpu::GpuModelOptions o;
  o.deterministic = true;
  o.recompute = mode;
  o.layer_begin = 0, o.layer_end = 2, o.stage_slots = 2;
  o.activation_arena = arena;
  dsv4gpu::GpuModel m(cfg, o);
  m.init_random(23);
  const int64_t N = mb.n_tokens(), n = m.stream_elems(mb);
  float* d_dx = nullptr;
  EXPECT_EQ(cudaMalloc(&d_dx, size_t(2 * n) * sizeof(float)), cudaSuccess);  // not a DeviceBuffer: not counted
  EXPECT_EQ(cudaMemcpy(d_dx, dx.data(), size_t(2 * n) * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  StepsRun r;
  for (int s = 0; s < kSteps; ++s) {
    m.zero_grads();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int64_t before = allocations();
    m.begin_step(0);
    for (int64_t k = 0; k < 2; ++k) m.forward_stage(k, ids.data() + k * N, nullptr, mb, nullptr);
    for (int64_t k = 0; k < 2; ++k) {
      std::vector<uint16_t> v(static_cast<size_t>(n));
      EXPECT_EQ(cudaMemcpy(v.data(), m.stage_output(k), v.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      r.outputs.push_back(std::move(v));
    }
    m.backward_stage(1, d_dx + n);  // 1F1B order: the later micro-batch first
    m.backward_stage(0, d_dx);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    r.step_allocations.push_back(allocations() - before);
  }
  r.arena = m.activation_arena();
  r.plan = m.activation_plan(mb);
  for (const std::string& nm : m.param_names()) r.grads[nm] = m.grad(nm);
  cudaFree(d_dx);
  return r;
}

TEST(ActivationArenaGpu, StageStepsWithTwoMicroBatchesInFlightAllocateNothingAfterThePlan) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("arena stage config");
  const dsv4::SeqLayout mb = dsv4::SeqLayout::packed(64, {{40, 24}});
  const trex::testing::TwoMicroBatchStageInputs in = trex::testing::two_micro_batch_stage_inputs(cfg, mb, 8);
  const std::vector<int32_t>& ids = in.ids;
  const std::vector<float>& dx = in.dx;
  for (Recompute mode : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    const std::string what = std::string("pp stage, 2 in flight, ") + dsv4::to_string(mode);
    const StepsRun with = stage(cfg, mode, true, ids, dx, mb);
    const StepsRun without = stage(cfg, mode, false, ids, dx, mb);
    expect_same(with, without, what.c_str());
    // Two slots' kept activations.
    expect_planned_once(with, 2 * with.plan.kept(), what.c_str());
  }
}

}  // namespace
