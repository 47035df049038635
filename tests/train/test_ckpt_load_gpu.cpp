// GpuModel::load_checkpoint from a checkpoint in the released format (official naming; FP8 E4M3 dense weights with
// E8M0 block scales, MXFP4 experts packed in int8 with E8M0 1x32 scales, BF16 / F32 elsewhere, I32 hash tables;
// sharded safetensors with model.safetensors.index.json): every rank of the one-GPU, pp2, ep2, dp2 and tp2 layouts
// (ranks as threads on one GPU over the thread-group communicator) holds exactly the CPU CheckpointReader's fp32
// de-quantisation of its partition, bit for bit: its own slice (value(): the fp32 master, or under data
// parallelism the bf16 compute copy of a sharded tensor) and the whole tensor gathered over its groups
// (gather_shard: the fp32 master pieces of every rank). Pipeline stages read disjoint tensors (their bytes read
// add up to the checkpoint's), an expert-parallel rank holds and reads only its experts, and a tiny staging buffer
// (chunked tensors) loads the same bits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "comm/two_rank_threads.h"
#include "core/dtype.h"
#include "core/files.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/naming.h"
#include "model/dsv4/param_table.h"
#include "model/dsv4/released_format.h"
#include "train/tiny_gpu_config.h"

namespace {

namespace fs = std::filesystem;
using namespace trex;
using dsv4gpu::GpuModel;
using dsv4gpu::GpuModelOptions;

constexpr int64_t kBlock = 32;  // quantization_config.weight_block_size: several blocks per tiny matrix

// TP rank `rank` of `tp`'s slice of a row-major tensor split along `axis`.
std::vector<float> slice_of(const std::vector<float>& v, const Shape& full, int axis, int tp, int rank) {
  if (axis < 0 || tp == 1) return v;
  int64_t rows = 1, inner = 1;
  for (size_t i = 0; i < full.size(); ++i) {
    if (int(i) < axis) rows *= full[i];
    if (int(i) > axis) inner *= full[i];
  }
  const int64_t pitch = full[size_t(axis)] * inner, width = pitch / tp;
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), v.begin() + r * pitch + rank * width, v.begin() + r * pitch + (rank + 1) * width);
  return out;
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

struct RankResult {
  GpuModel::LoadStats st;
  std::vector<std::string> names;
  int64_t mismatches = 0;
  std::string first_mismatch;
};

// Loads every rank of a layout (`world` ranks as threads; options(r, comm) builds rank r's options) and compares
// each rank's tensors with the CPU reader's.
std::vector<RankResult> load_layout(const dsv4::ModelConfig& cfg, const fs::path& dir, int world,
                                    const std::function<GpuModelOptions(int, comm::Communicator*)>& options,
                                    size_t staging) {
  const dsv4::CheckpointReader reader(dir);
  auto comms = comm::make_thread_group(world, 120.0);
  std::vector<RankResult> res(static_cast<size_t>(world));
  trex::testing::run_ranks(world, [&](int r) {
    const GpuModelOptions o = options(r, comms[size_t(r)].get());
    GpuModel m(cfg, o);
    m.init_random(99);  // every value must be overwritten by the load
    RankResult& out = res[size_t(r)];
    out.st = m.load_checkpoint(reader, staging);
    out.names = m.param_names();
    const int tp = m.tp_size();
    const int tp_rank = o.tp ? o.tp->rank() : 0;
    auto mismatch = [&](const std::string& what) {
      if (out.mismatches++ == 0) out.first_mismatch = what;
    };
    for (const std::string& n : out.names) {  // the same order on every rank: gather_shard is collective
      const HostTensor t = reader.load(n);
      const std::vector<float> full(t.f32(), t.f32() + t.numel());
      if (m.gather_shard(n) != full) mismatch(n + " (gathered fp32 master)");
      const std::vector<float> mine = slice_of(full, m.full_shape(n), m.tp_axis(n), tp, tp_rank);
      const std::vector<float> v = m.value(n);
      if (v != mine && !(m.dp_size() > 1 && v == bf16_rounded(mine))) mismatch(n + " (this rank's slice)");
    }
    for (const std::string& n : m.router_bias_names()) {
      const HostTensor t = reader.load(n);
      if (m.router_bias(n) != std::vector<float>(t.f32(), t.f32() + t.numel())) mismatch(n + " (router bias)");
    }
  });
  return res;
}

int64_t checkpoint_bytes(const fs::path& dir) { return int64_t(ckpt::SafetensorsReader(dir).total_bytes()); }

class CkptLoadGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
    cfg_ = trex::testing::tiny_gpu_config("checkpoint load test config", 0);
    dir_ = fs::temp_directory_path() / fmt::format("trex_ckpt_load_{}", ::getpid());
    fs::remove_all(dir_);
    dsv4::write_random_released(dir_, cfg_, kBlock, 11, size_t(48) << 10);  // several shards
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void expect_exact(const std::vector<RankResult>& res, const char* layout) {
    for (size_t r = 0; r < res.size(); ++r) {
      EXPECT_EQ(res[r].mismatches, 0) << layout << " rank " << r << ": first mismatch " << res[r].first_mismatch;
      EXPECT_GT(res[r].st.tensors, 0);
      EXPECT_LE(res[r].st.host_peak_bytes, int64_t(GpuModel::kDefaultStagingBytes));
      std::printf("%s rank %zu: %lld tensors, %lld bytes read, %.3f MB fp32 placed, %.3f s, host peak %.1f MB\n",
                  layout, r, (long long)res[r].st.tensors, (long long)res[r].st.stored_bytes,
                  double(res[r].st.bytes) / 1e6, res[r].st.seconds, double(res[r].st.host_peak_bytes) / 1e6);
    }
  }
  dsv4::ModelConfig cfg_;
  fs::path dir_;
};

TEST_F(CkptLoadGpu, TheReleasedFormatIsSharded) {
  ASSERT_TRUE(fs::exists(dir_ / "model.safetensors.index.json"));
  const dsv4::CheckpointReader reader(dir_);
  EXPECT_EQ(reader.block_size(), kBlock);
  int fp8 = 0, fp4 = 0;
  for (const std::string& n : reader.official_names()) {
    fp8 += reader.source(n).kind == dsv4::TensorSource::Kind::Fp8Block;
    fp4 += reader.source(n).kind == dsv4::TensorSource::Kind::Fp4Packed;
  }
  EXPECT_GT(fp8, 0);
  EXPECT_GT(fp4, 0);
}

TEST_F(CkptLoadGpu, OneGpuEqualsTheCpuDequantisationAndATinyStagingLoadsTheSame) {
  const auto one = [](int, comm::Communicator*) { return GpuModelOptions{}; };
  const auto res = load_layout(cfg_, dir_, 1, one, GpuModel::kDefaultStagingBytes);
  expect_exact(res, "one GPU");
  EXPECT_EQ(res[0].st.stored_bytes, checkpoint_bytes(dir_)) << "one GPU reads every stored byte once";
  const auto tiny = load_layout(cfg_, dir_, 1, one, 4096);  // every tensor in many chunks
  expect_exact(tiny, "one GPU, 4 KB staging");
  // The staging buffer, or the hash table decoded on the host (I64 values and their int32 copy) when larger.
  EXPECT_EQ(tiny[0].st.host_peak_bytes, std::max<int64_t>(4096, cfg_.vocab_size * cfg_.topk * 12));
}

TEST_F(CkptLoadGpu, Pp2StagesReadDisjointTensors) {
  const auto res = load_layout(cfg_, dir_, 2, [](int r, comm::Communicator*) {
    GpuModelOptions o;
    o.layer_begin = r == 0 ? 0 : 2, o.layer_end = r == 0 ? 2 : 3;
    return o;
  }, GpuModel::kDefaultStagingBytes);
  expect_exact(res, "pp2");
  for (const std::string& n : res[1].names) EXPECT_EQ(n.rfind("layers.0.", 0), std::string::npos) << n;
  EXPECT_EQ(res[0].st.stored_bytes + res[1].st.stored_bytes, checkpoint_bytes(dir_));
}

TEST_F(CkptLoadGpu, Ep2RanksHoldAndReadOnlyTheirExperts) {
  const auto res = load_layout(cfg_, dir_, 2, [](int, comm::Communicator* c) {
    GpuModelOptions o;
    o.ep = c;
    return o;
  }, GpuModel::kDefaultStagingBytes);
  expect_exact(res, "ep2");
  const int64_t E = cfg_.n_routed_experts;
  for (int r = 0; r < 2; ++r) {
    for (const std::string& n : res[size_t(r)].names) {
      dsv4::ExpertKey ek;
      if (!dsv4::parse_official_expert_key(n, &ek)) continue;
      EXPECT_GE(ek.expert, r * E / 2) << n << " on rank " << r;
      EXPECT_LT(ek.expert, (r + 1) * E / 2) << n << " on rank " << r;
    }
    EXPECT_LT(res[size_t(r)].st.stored_bytes, checkpoint_bytes(dir_)) << "rank " << r << " read other ranks' experts";
  }
}

TEST_F(CkptLoadGpu, Dp2ShardsEqualTheCpuDequantisation) {
  const auto res = load_layout(cfg_, dir_, 2, [](int, comm::Communicator* c) {
    GpuModelOptions o;
    o.dp = c;
    return o;
  }, GpuModel::kDefaultStagingBytes);
  expect_exact(res, "dp2");
}

TEST_F(CkptLoadGpu, Tp2SlicesEqualTheCpuDequantisation) {
  for (size_t staging : {GpuModel::kDefaultStagingBytes, size_t(4096)}) {
    const auto res = load_layout(cfg_, dir_, 2, [](int, comm::Communicator* c) {
      GpuModelOptions o;
      o.tp = c;
      return o;
    }, staging);
    expect_exact(res, staging == 4096 ? "tp2, 4 KB staging" : "tp2");
    // The split tensors' other halves are not read: each rank reads less than the whole checkpoint.
    for (const RankResult& r : res) EXPECT_LT(r.st.stored_bytes, checkpoint_bytes(dir_));
  }
}

}  // namespace
