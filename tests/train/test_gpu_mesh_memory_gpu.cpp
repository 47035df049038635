// Issue 17: a layout whose ranks do not fit is refused by `trex train --device cuda` before anything is allocated,
// with the reason and the numbers (train/cuda/rank_memory.h; the count itself is tests/train/test_rank_memory.cpp's):
//  - pp=2 x dp=2 x ep=2 as thread ranks on this GPU with train.device_memory_gib below a rank's count: every rank
//    refuses with the same message (the rank, the layout, each term of the count, the limit) and the device's
//    memory pool, where every model buffer comes from, never grew;
//  - the same layout with the limit above every rank's count builds its engines;
//  - the ranks on one device add up: four thread ranks whose counts fit alone but not together in what the device
//    has free (a limit is not needed: the ranks' count is compared with the free memory) are refused naming them;
//  - the product command: `trex train --device cuda` with the limit exits non-zero with the refusal and writes no
//    checkpoint.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/rank_threads.h"
#include "comm/thread_group.h"
#include "kernels/cuda/cuda_check.h"
#include "parallel/rank_partition.h"
#include "train/cli_test_util.h"
#include "train/config.h"
#include "train/cuda/gpu_mesh_engine.h"
#include "train/cuda/rank_memory.h"
#include "train/gpu_mesh_test_support.h"
#include "train/tiny_gpu_config.h"
#include "tiny_corpus.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;

namespace {

using Data = trex::testing::TinyCorpus;

Data& dat() {
  static Data d("trex_gpu_mesh_memory", trex::testing::corpus_lines([](int i) {
                  return "count " + std::to_string(i % 5) + " bytes of rank " + std::to_string(i % 7) + " first. ";
                }),
                300, 64);
  return d;
}

dsv4::ModelConfig model_config() {
  return trex::testing::with_corpus_vocab(trex::testing::tiny_gpu_config("tiny GPU memory config"), dat().tok);
}

TrainConfig run_config(const std::string& parallel) {
  trex::testing::LayoutRunYaml y;
  y.checkpoint = "{every: 100, keep_last: 1}";
  return trex::testing::layout_run_config(y, parallel, "memory.yaml");
}

// This rank's count as the engine makes it (micro-batches of data.batch_size sequences of data.seq_len tokens).
RankMemory engine_count(const TrainConfig& cfg, int rank) {
  const parallel::RankPartition p = parallel::rank_partition(cfg.parallel.mesh, rank, model_config(),
                                                             cfg.grad_accum * cfg.batch_size, cfg.batch_size);
  dsv4gpu::GpuModelOptions o;
  o.zero = cfg.parallel.zero;
  return count_rank_memory(model_config(), p, cfg.seq_len, o);
}

cudaMemPool_t device_pool() {
  int dev = 0;
  cudaMemPool_t pool;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  return pool;
}

uint64_t pool_attr(cudaMemPoolAttr a) {
  uint64_t v = 0;
  TREX_CUDA(cudaMemPoolGetAttribute(device_pool(), a, &v));
  return v;
}

// Every rank of cfg's layout builds its engine; the error each threw ("" when it built).
std::vector<std::string> build_engines(const TrainConfig& cfg, int world) {
  auto ranks = comm::make_thread_group(world, 120.0);
  std::vector<std::string> errors(static_cast<size_t>(world));
  trex::testing::run_ranks(world, [&](int r) {
    try {
      GpuMeshEngine engine(cfg, model_config(), trex::testing::layout_train_options(false), *ranks[size_t(r)]);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
    }
  });
  return errors;
}

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

}  // namespace

TEST(GpuMeshMemoryRefusal, ALayoutOverTheLimitIsRefusedOnEveryRankBeforeAllocating) {
  TrainConfig cfg = run_config("parallel: {pp: 2, dp: 2, ep: 2}\n");
  const RankMemory rank0 = engine_count(cfg, 0);
  ASSERT_GT(rank0.total(), 0);
  cfg.device_memory_gib = 0.5 * double(rank0.total()) / double(int64_t(1) << 30);
  // Nothing comes from the pool between here and the refusal: its high-water mark is reset to what is in use now.
  const uint64_t before = pool_attr(cudaMemPoolAttrUsedMemCurrent);
  uint64_t zero = 0;
  TREX_CUDA(cudaMemPoolSetAttribute(device_pool(), cudaMemPoolAttrUsedMemHigh, &zero));
  const std::vector<std::string> errors = build_engines(cfg, 4);
  EXPECT_EQ(pool_attr(cudaMemPoolAttrUsedMemHigh), before) << "a rank allocated from the pool before refusing";
  std::printf("rank 0: %s\n", errors[0].c_str());
  for (int r = 0; r < 4; ++r) {
    const std::string& e = errors[size_t(r)];
    for (const std::string& w : {std::string("memory.yaml"), std::string("rank 0 does not fit"),
                                 std::string("layout pp=2 dp=2 ep=2"), std::string("train.device_memory_gib"),
                                 std::string("micro-batches of 2 x 64 tokens")})
      EXPECT_TRUE(contains(e, w)) << "rank " << r << ": '" << w << "' not in: " << e;
  }
  // Rank 0's message carries its count, term by term, as count_rank_memory gives it.
  for (const std::string& w : {std::string("Rank 0's count: ") + rank0.describe().substr(0, 20),
                               std::string("bf16 weights"), std::string("activations"), std::string("layers [0, 2)"),
                               std::string("workspace"), std::string("recompute: full or selective")})
    EXPECT_TRUE(contains(errors[0], w)) << "'" << w << "' not in: " << errors[0];

  // Above every rank's count (the largest plus a margin for nothing: the count is what is compared) it builds.
  int64_t most = 0;
  for (int r = 0; r < 4; ++r) most = std::max(most, engine_count(cfg, r).total());
  cfg.device_memory_gib = 1.01 * double(most) / double(int64_t(1) << 30);
  for (const std::string& e : build_engines(cfg, 4)) EXPECT_EQ(e, "");
}

TEST(GpuMeshMemoryRefusal, RanksOnOneDeviceAddUpAgainstItsFreeMemory) {
  // Four thread ranks on this GPU, each counting more than a quarter of what it has free: every rank alone fits,
  // together they do not. data.batch_size grows the activations until one rank's count passes free / 4.
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  TrainConfig cfg = run_config("parallel: {dp: 4}\n");
  cfg.seq_len = 4096;
  cfg.grad_accum = 4;
  int64_t rows = 1;
  for (; rows <= 4096; rows *= 2) {
    cfg.batch_size = rows;
    if (engine_count(cfg, 0).total() > int64_t(free_b / 4)) break;
  }
  ASSERT_LE(rows, 4096) << "no batch makes a rank count a quarter of " << free_b << " free bytes";
  ASSERT_LT(engine_count(cfg, 0).total(), int64_t(free_b)) << "one rank alone should fit";
  const std::vector<std::string> errors = build_engines(cfg, 4);
  std::printf("rank 0 (batch %lld x %lld): %s\n", (long long)cfg.batch_size, (long long)cfg.seq_len,
              errors[0].c_str());
  for (int r = 0; r < 4; ++r)
    for (const char* w : {"does not fit: 4 ranks on CUDA device", "rank 0 ", "rank 3 ", "GiB free of"})
      EXPECT_TRUE(contains(errors[size_t(r)], w)) << "rank " << r << ": '" << w << "' not in: " << errors[size_t(r)];
}

TEST(GpuMeshMemoryRefusal, TrexTrainExitsWithTheRefusalAndWritesNoCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("trex_gpu_mesh_memory_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bin = TREX_BINARY;
  ASSERT_EQ(trex::testing::prepare_tiny_corpus(dir, bin), "");
  nlohmann::json model = trex::testing::tiny_gpu_config_json();
  model["vocab_size"] = 320;
  const nlohmann::json c = {
      {"seed", 5},
      {"model", {{"type", "dsv4"}, {"dsv4", model}, {"use_mtp", false}}},
      {"data", {{"shards", (dir / "shards").string()}, {"tokenizer", (dir / "tok.json").string()}, {"seq_len", 32},
                {"batch_size", 2}, {"grad_accum", 2}}},
      {"optimizer", {{"kind", "adamw"}}},
      {"train", {{"max_steps", 2}, {"device_memory_gib", 0.001}}},
      {"checkpoint", {{"every", 1}, {"keep_last", 1}}},
      {"logging", {{"plot", false}}}};
  std::ofstream(dir / "run.json") << c.dump(2);
  std::string out;
  const int rc = trex::testing::sh(bin + " train " + (dir / "run.json").string() + " --out " + (dir / "run").string() +
                                       " --device cuda --no-progress",
                                   &out);
  std::printf("%s\n", out.c_str());
  EXPECT_NE(rc, 0);
  for (const char* w : {"run.json", "rank 0 does not fit", "train.device_memory_gib 0.00", "bf16 weights"})
    EXPECT_TRUE(contains(out, w)) << "'" << w << "' not in: " << out;
  EXPECT_FALSE(fs::exists(dir / "run" / "checkpoints") && !fs::is_empty(dir / "run" / "checkpoints")) << out;
  fs::remove_all(dir);
}
