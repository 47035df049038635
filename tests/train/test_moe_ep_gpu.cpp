// The routed-expert paths of the GPU MoE against each other.
// MoeGpuPaths (one GPU): grouped GEMMs (GpuModelOptions::moe_grouped_gemm) against one cuBLASLt GEMM per expert:
// the same products with other bf16 roundings, so losses within 1e-3 and gradients within the bf16 noise the
// GPU-vs-CPU parity test allows (0.1 relative L2 per tensor, 0.5 for tensors of < 64 elements).
// MoeEpGpu/{nccl,threads} (two GPUs with NCCL, or both ranks on one GPU over the thread group; one thread per
// rank): each rank trains the same weights on its own batch,
// all experts local and then with the experts split over the two ranks (rank r computes experts
// [r E/2, (r+1) E/2) for both ranks' tokens), for both expert paths. Exact checks: an expert is not allocated on
// the rank that does not own it. Noise-referenced checks: the expert-parallel run regroups rows, and other kernels
// of the step (fp32 atomics in the embedding / attention backward) are not bitwise reproducible, so the reference
// for "equal" is the difference between the two all-local runs (per-expert vs grouped GEMMs): the expert-parallel
// loss, every non-expert gradient and the owner's expert gradient against the sum of both ranks' all-local
// gradients (what a data-parallel reduction forms) must differ by at most 10 x that reference + 1e-4 (relative).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "kernels/gpu_test_util.h"
#include "comm/nccl_communicator.h"
#include "comm/thread_group.h"
#include "comm/two_rank_threads.h"
#include "model/cuda/gpu_model.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

using trex::testing::n_devices;
using trex::testing::run2;


// The GPU parity test's fixture-like model: every attention type, hash and score MoE layers, a shared expert.
dsv4::ModelConfig ep_config() { return trex::testing::tiny_gpu_config("EP test config (the parity test's)"); }

using Grads = std::map<std::string, std::vector<float>>;

using trex::gpu_test::rel_l2;

struct Batch {
  dsv4::SeqLayout layout = dsv4::SeqLayout::packed(64, {{64}, {40, 24}});
  std::vector<int32_t> ids, labels;
  explicit Batch(uint32_t seed, int64_t V) {
    std::mt19937 g(seed);
    ids.resize(128), labels.resize(128);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = int32_t(g() % uint32_t(V));
      labels[i] = (i % 11 == 3) ? -100 : ids[i];
    }
  }
};

// One training step's loss and gradients from the same seeded weights.
double run_step(const dsv4::ModelConfig& cfg, const dsv4gpu::GpuModelOptions& o, const Batch& bt, Grads& grads) {
  dsv4gpu::GpuModel m(cfg, o);
  m.init_random(5);
  const double loss = m.forward(bt.ids.data(), bt.labels.data(), bt.layout);
  m.zero_grads();
  m.backward();
  for (const std::string& n : m.param_names()) grads[n] = m.grad(n);
  return loss;
}

TEST(MoeGpuPaths, GroupedGemmsMatchPerExpertGemms) {
  if (n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const dsv4::ModelConfig cfg = ep_config();
  const Batch bt(100, cfg.vocab_size);
  Grads g_each, g_grouped;
  dsv4gpu::GpuModelOptions o;
  const double l_each = run_step(cfg, o, bt, g_each);
  o.moe_grouped_gemm = true;
  const double l_grouped = run_step(cfg, o, bt, g_grouped);
  std::printf("loss per-expert GEMMs %.7f grouped %.7f\n", l_each, l_grouped);
  EXPECT_NEAR(l_grouped, l_each, 1e-3 * std::abs(l_each));
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : g_each) {
    const double e = rel_l2(g_grouped.at(name), g);
    EXPECT_LT(e, g.size() < 64 ? 0.5 : 0.1) << name;
    if (e > worst) worst = e, worst_name = name;
  }
  std::printf("grouped vs per-expert: worst gradient rel L2 %.2e (%s)\n", worst, worst_name.c_str());
}

struct RankRun {
  double loss_local[2] = {0, 0}, loss_ep[2] = {0, 0};  // [per-expert, grouped]
  Grads g_local[2], g_ep[2];
};

// The backend: "nccl" (two GPUs, one rank each) or "threads" (both ranks on one GPU, comm/thread_group.h).
class MoeEpGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeEpGpu, TwoRanksMatchAllLocalExperts) {
  const bool nccl = GetParam() == "nccl";
  if (n_devices() < (nccl ? 2 : 1)) GTEST_SKIP() << "needs " << (nccl ? 2 : 1) << " GPUs, " << n_devices() << " visible";
  const dsv4::ModelConfig cfg = ep_config();
  const comm::NcclId id = nccl ? comm::nccl_new_id() : comm::NcclId{};
  auto group = nccl ? std::vector<std::unique_ptr<comm::Communicator>>{} : comm::make_thread_group(2, 120);
  RankRun runs[2];
  run2([&](int r) {
    auto ep = nccl ? comm::make_nccl_communicator(id, r, 2, r, 60) : std::move(group[size_t(r)]);
    const Batch bt(uint32_t(100 + r), cfg.vocab_size);  // each rank its own tokens
    for (int grouped = 0; grouped < 2; ++grouped) {
      dsv4gpu::GpuModelOptions o;
      o.moe_grouped_gemm = grouped == 1;
      runs[r].loss_local[grouped] = run_step(cfg, o, bt, runs[r].g_local[grouped]);
      o.ep = ep.get();
      runs[r].loss_ep[grouped] = run_step(cfg, o, bt, runs[r].g_ep[grouped]);
    }
  });
  if (HasFailure()) return;
  const int64_t E = cfg.n_routed_experts;
  // The reference noise is the distance between the two expert-GEMM paths on the same run; since the sm90 grouped
  // kernel reproduces cuBLASLt bit for bit it is ~0, so the floor is what legitimately separates an expert-parallel
  // run from an all-local one: per-expert GEMMs see other row counts (other cuBLASLt algorithms, other fp32
  // summation orders) and round to bf16 differently. Measured 2e-4..6e-4 rel L2 (01:47 call); the floor is 2e-3,
  // about one bf16 rounding (2^-9). The losses are held to 1e-6 (they came out bitwise equal).
  auto bound = [](double ref) { return 10 * ref + 2e-3; };
  for (int r = 0; r < 2; ++r) {
    const double ref = std::abs(runs[r].loss_local[1] / runs[r].loss_local[0] - 1);
    for (int p = 0; p < 2; ++p) {
      const double e = std::abs(runs[r].loss_ep[p] / runs[r].loss_local[p] - 1);
      std::printf("rank %d %s: loss all-local %.7f expert-parallel %.7f (rel %.1e, reference %.1e)\n", r,
                  p ? "grouped" : "per-expert", runs[r].loss_local[p], runs[r].loss_ep[p], e, ref);
      EXPECT_LE(e, 10 * ref + 1e-6) << "rank " << r << " path " << p;
    }
  }
  for (int p = 0; p < 2; ++p) {
    double worst_dense = 0, worst_expert = 0;
    int n_expert = 0;
    for (const auto& [name, g0] : runs[0].g_local[p]) {
      const size_t pos = name.find("ffn.experts.");
      if (pos == std::string::npos) {
        for (int r = 0; r < 2; ++r) {
          const double ref = rel_l2(runs[r].g_local[1 - p].at(name), runs[r].g_local[p].at(name));
          const double e = rel_l2(runs[r].g_ep[p].at(name), runs[r].g_local[p].at(name));
          worst_dense = std::max(worst_dense, e);
          EXPECT_LE(e, bound(ref)) << name << " rank " << r << " path " << p << " (reference " << ref << ")";
        }
        continue;
      }
      const int64_t e = std::stoll(name.substr(pos + 12));
      const int owner = int(e / (E / 2));
      std::vector<float> sum(g0.size()), sum_other(g0.size());
      for (size_t i = 0; i < g0.size(); ++i) {
        sum[i] = runs[0].g_local[p].at(name)[i] + runs[1].g_local[p].at(name)[i];
        sum_other[i] = runs[0].g_local[1 - p].at(name)[i] + runs[1].g_local[1 - p].at(name)[i];
      }
      const double ref = rel_l2(sum_other, sum);
      const double err = rel_l2(runs[owner].g_ep[p].at(name), sum);
      worst_expert = std::max(worst_expert, err);
      EXPECT_LE(err, bound(ref)) << name << " (owner rank " << owner << ", path " << p << ", reference " << ref << ")";
      // The non-owner does not hold the expert at all (expert sharding, gpu_impl.h region X).
      EXPECT_EQ(runs[1 - owner].g_ep[p].count(name), 0u) << name << " is allocated on the non-owner rank " << 1 - owner;
      ++n_expert;
    }
    std::printf("%s: expert tensors %d, worst rel L2 vs summed all-local %.2e; other tensors worst %.2e\n",
                p ? "grouped" : "per-expert", n_expert, worst_expert, worst_dense);
    EXPECT_GT(n_expert, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MoeEpGpu, ::testing::Values(std::string("nccl"), std::string("threads")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
