// The count `trex train --device cuda` makes of each rank's device memory before allocating (train/cuda/
// rank_memory.h), on the CPU (no device is touched: the tables alone): its parameter state is the planner's
// (plan/rank_memory.h, the same parameter table) up to the arena's alignment padding, its activations follow the
// micro-batches the schedule holds at once, its total is the sum of the terms it prints; and the refusal names
// the rank, the device and the numbers. That the GPU model allocates what is counted is GpuMeshEpMemory's and
// GpuMeshTpMemory's; that the engine refuses a layout over the limit before allocating is GpuMeshMemoryRefusal's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/dsv4/param_table.h"
#include "train/config.h"
#include "train/tiny_gpu_config.h"
#include "train/yaml.h"
#ifdef TREX_HAVE_CUDA
#include "parallel/rank_partition.h"
#include "plan/rank_memory.h"
#include "train/cuda/rank_memory.h"
#endif

using namespace trex;

namespace {

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

}  // namespace

TEST(RankMemoryConfig, DeviceMemoryLimitIsReadAndMustNotBeNegative) {
  const std::string base = "seed: 1\nmodel: {type: dsv4}\ndata: {shards: x, tokenizer: y}\n";
  EXPECT_EQ(train::parse_train_config(train::parse_yaml(base, "run.yaml"), "run.yaml").device_memory_gib, 0.0);
  EXPECT_EQ(train::parse_train_config(train::parse_yaml(base + "train: {device_memory_gib: 40.5}\n", "run.yaml"),
                                      "run.yaml")
                .device_memory_gib,
            40.5);
  try {
    train::parse_train_config(train::parse_yaml(base + "train: {device_memory_gib: -1}\n", "run.yaml"), "run.yaml");
    ADD_FAILURE() << "a negative limit was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "run.yaml") && contains(e.what(), "train.device_memory_gib")) << e.what();
  }
}

#ifdef TREX_HAVE_CUDA

namespace {

dsv4::ModelConfig tiny() { return trex::testing::tiny_gpu_config("tiny"); }

train::RankMemory count(const dsv4::ModelConfig& cfg, const parallel::MeshSpec& spec, int rank, int64_t batch,
                        int zero = 1) {
  const parallel::RankPartition p = parallel::rank_partition(spec, rank, cfg, batch, 1);
  dsv4gpu::GpuModelOptions o;
  o.zero = zero;
  return train::count_rank_memory(cfg, p, 64, o);
}

train::DeviceClaim claim(uint8_t device, int64_t need_mib, int64_t free_mib, int64_t limit_mib = 0) {
  train::DeviceClaim c;
  c.device.fill(device);
  c.ordinal = device;
  c.need = need_mib << 20, c.free = free_mib << 20, c.total = int64_t(140) << 30, c.limit = limit_mib << 20;
  return c;
}

}  // namespace

TEST(RankMemory, ParameterStateIsThePlannersForEveryRank) {
  const dsv4::ModelConfig cfg = tiny();
  int64_t fp32_tensors = 0;
  for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) fp32_tensors += s.trained() && s.dtype == DType::F32;
  const int64_t pad = 512 * (cfg.n_layers + 3) + 8 * fp32_tensors;  // the buckets' and region X's alignment
  struct Case {
    parallel::MeshSpec spec;
    int zero;
  };
  for (const Case& k : {Case{{1, 2, 1, 1, 1, 1}, 1}, Case{{1, 2, 2, 1, 1, 1}, 1}, Case{{1, 4, 2, 1, 1, 1}, 2},
                        Case{{1, 2, 2, 1, 2, 2}, 1}, Case{{1, 2, 2, 1, 2, 1}, 3}}) {
    const parallel::MeshSpec& s = k.spec;
    for (int r = 0; r < s.dp * s.tp; ++r) {
      const train::RankMemory m = count(cfg, s, r, 8, k.zero);
      const plan::RankParamState want = plan::rank_param_state(cfg, s.dp, s.ep, r / s.tp, k.zero, s.tp, s.etp);
      const std::string what = "dp=" + std::to_string(s.dp) + " ep=" + std::to_string(s.ep) + " tp=" +
                               std::to_string(s.tp) + " etp=" + std::to_string(s.etp) + " zero " +
                               std::to_string(k.zero) + " rank " + std::to_string(r);
      EXPECT_EQ(m.params.n_params, want.held()) << what;
      EXPECT_GE(double(m.params.compute_bytes()), want.weight_bytes()) << what;
      EXPECT_LE(double(m.params.compute_bytes()), want.weight_bytes() + 2.0 * double(pad)) << what;
      EXPECT_GE(double(m.params.grad_bytes()), want.grad_bytes()) << what;
      EXPECT_LE(double(m.params.grad_bytes()), want.grad_bytes() + 4.0 * double(pad)) << what;
      EXPECT_NEAR(double(m.params.master_bytes() + m.params.adamw_bytes()), want.optimizer_bytes(), 12.0 * double(pad))
          << what;
      if (k.zero == 3) EXPECT_GT(m.params.weight_buffer_bytes, 0) << what << ": ZeRO-3's gathered buckets";
      if (k.zero == 2) EXPECT_GT(m.params.grad_buffer_bytes, 0) << what << ": ZeRO-2's bucket buffers";
    }
  }
}

TEST(RankMemory, ActivationsFollowTheMicroBatchesTheScheduleHolds) {
  const dsv4::ModelConfig cfg = tiny();
  // pp = 2: stage 0 holds min(2, M) micro-batches under 1F1B, stage 1 one.
  const parallel::MeshSpec spec{2, 1, 1, 1, 1, 1};
  const train::RankMemory one = count(cfg, spec, 0, 1), four = count(cfg, spec, 0, 4);
  ASSERT_EQ(one.plans.size(), 1u);
  EXPECT_EQ(one.held[0], 1);
  EXPECT_EQ(four.held[0], 2);
  EXPECT_GT(one.plans[0].kept(), 0);
  EXPECT_EQ(four.activations - one.activations, one.plans[0].kept()) << "one more micro-batch held on stage 0";
  const train::RankMemory last = count(cfg, spec, 1, 4);
  EXPECT_EQ(last.held[0], 1);
  EXPECT_GT(last.lm_head, 0) << "the head's scratch on the last stage";
  EXPECT_EQ(one.lm_head, 0);
  EXPECT_GT(one.workspace.boundary, 0) << "stage 0 receives gradients from stage 1";
  // The total is the sum of the printed terms.
  for (const train::RankMemory* m : {&one, &four, &last}) {
    EXPECT_EQ(m->total(), m->parameter_state() + m->activations + m->workspace.total() + m->lm_head +
                              m->bucket_buffers() + m->accumulation);
    EXPECT_TRUE(contains(m->describe(), "layers [")) << m->describe();
  }
  // A larger micro-batch keeps more.
  const parallel::RankPartition p = parallel::rank_partition(spec, 0, cfg, 8, 2);
  EXPECT_GT(train::count_rank_memory(cfg, p, 64, {}).activations, four.activations);
}

TEST(RankMemory, PaddingLayersMoveTheSplitAsTheTrainerDoes) {
  dsv4::ModelConfig cfg = tiny();
  // 3 layers + 1 no-op layer over 2 stages: [0, 2) and [2, 3) + the padding.
  const parallel::RankPartition p0 = parallel::rank_partition({2, 1, 1, 1, 1, 1}, 0, cfg, 2, 1, 1);
  const parallel::RankPartition p1 = parallel::rank_partition({2, 1, 1, 1, 1, 1}, 1, cfg, 2, 1, 1);
  EXPECT_EQ(p0.chunks[0].layer_begin, 0);
  EXPECT_EQ(p0.chunks[0].layer_end, 2);
  EXPECT_EQ(p1.chunks[0].layer_begin, 2);
  EXPECT_EQ(p1.chunks[0].layer_end, 3);
  // 3 layers + 3 no-op layers over 3 stages: two slots each, the last stage only padding: no layer, refused.
  EXPECT_THROW(parallel::rank_partition({3, 1, 1, 1, 1, 1}, 2, cfg, 3, 1, 3), Error);
}

TEST(DeviceMemoryRefusal, RanksSharingADeviceAddUpAndTheRefusalNamesThemWithTheNumbers) {
  // Ranks 0, 1 on device 1; ranks 2, 3 on device 2, with 1,000 MiB free each.
  std::vector<train::DeviceClaim> c{claim(1, 400, 1000), claim(1, 400, 1000), claim(2, 600, 1000),
                                    claim(2, 300, 1010)};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(train::device_memory_refusal(c, r, "mine"), "") << r;
  c[3].need = int64_t(500) << 20;  // device 2: 1,100 MiB counted, 1,000 free (the lower of its ranks' reads)
  const std::string at0 = train::device_memory_refusal(c, 0, "rank 0's terms");
  const std::string at2 = train::device_memory_refusal(c, 2, "rank 2's terms");
  for (const std::string& w : {"does not fit", "2 ranks on CUDA device 2 (of rank 2)", "1.07 GiB", "rank 2 0.59",
                               "rank 3 0.49", "0.98 GiB free of 140.00"}) {
    EXPECT_TRUE(contains(at0, w)) << "'" << w << "' not in: " << at0;
    EXPECT_TRUE(contains(at2, w)) << "'" << w << "' not in: " << at2;
  }
  EXPECT_FALSE(contains(at0, "rank 0's terms")) << "rank 0 is not on the device that does not fit: " << at0;
  EXPECT_TRUE(contains(at2, "Rank 2's count: rank 2's terms")) << at2;
  // One rank over its own limit is named first, with the limit.
  c = {claim(1, 400, 1000, 300), claim(2, 100, 1000, 300)};
  const std::string lim = train::device_memory_refusal(c, 0, "terms");
  EXPECT_TRUE(contains(lim, "rank 0 does not fit") && contains(lim, "0.39 GiB") &&
              contains(lim, "train.device_memory_gib 0.29") && contains(lim, "Rank 0's count: terms"))
      << lim;
  EXPECT_TRUE(contains(train::device_memory_refusal(c, 1, "terms"), "rank 0 does not fit"));
  EXPECT_THROW(train::device_memory_refusal(c, 2, ""), Error);
}

TEST(DeviceMemoryRefusal, TheSeededInitOnTheHostIsCountedPerHost) {
  // Two hosts, two ranks each, with 10 GiB available; each rank builds a 4 GiB host model (no model.init_from).
  std::vector<train::DeviceClaim> c{claim(1, 100, 1000), claim(2, 100, 1000), claim(3, 100, 1000), claim(4, 100, 1000)};
  for (size_t r = 0; r < c.size(); ++r) {
    c[r].host = r < 2 ? 7 : 9;
    c[r].host_need = int64_t(4) << 30;
    c[r].host_free = int64_t(10) << 30;
  }
  EXPECT_EQ(train::device_memory_refusal(c, 0, ""), "");
  c[3].host_need = int64_t(7) << 30;  // host 9: 11 GiB
  const std::string why = train::device_memory_refusal(c, 0, "");
  for (const std::string& w : {"does not fit on the host", "2 ranks of the host of rank 2", "11.00 GiB together",
                               "10.00 GiB available", "model.init_from"})
    EXPECT_TRUE(contains(why, w)) << "'" << w << "' not in: " << why;
  // Unknown availability (no /proc/meminfo) is not checked; nothing built on the host is not either.
  for (auto& k : c) k.host_free = -1;
  EXPECT_EQ(train::device_memory_refusal(c, 0, ""), "");
  for (auto& k : c) k.host_free = 1, k.host_need = 0;
  EXPECT_EQ(train::device_memory_refusal(c, 0, ""), "");
}

#endif
