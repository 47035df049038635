// The CUDA backend's decode ops under the block program (model/cuda/cuda_backend.h, "Decoding"), below the engine:
// a decode pass of one sequence's prompt chunk and then single tokens gives the uncached GPU model's logits of the
// same positions within bf16 noise (the decode sites use the fused mHC kernel and a bf16 head collapse, the
// training forward the GEMM mixing path and an fp32 collapse: the engine's tolerance of
// TensorCoreAttentionAndGroupedExpertsMatchTheReferencePaths), and the backend refuses what
// would read the wrong memory: a decode pass before set_decode, more slots than it holds, another model's caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "gpu_engine_test_util.h"
#include "model/cuda/cuda_backend.h"
#include "model/dsv4/program.h"
#include "train/tiny_gpu_config.h"

namespace {

using namespace trex;

std::unique_ptr<dsv4gpu::GpuModel> inference_model(const dsv4::ModelConfig& cfg, uint64_t seed) {
  dsv4gpu::GpuModelOptions mo;
  mo.gradients = false;
  auto m = std::make_unique<dsv4gpu::GpuModel>(cfg, mo);
  m->init_random(seed);
  return m;
}

// Logits [n_rows, V] of one decode pass of `ids` appended to `caches` at position `at`, copied back.
std::vector<float> decode(dsv4gpu::GpuModel& model, dsv4::SequenceCaches* caches, const std::vector<int32_t>& ids,
                          int64_t at, bool all_rows) {
  const int64_t n = int64_t(ids.size()), V = model.impl().cfg.vocab_size;
  std::vector<int64_t> pos, seq(size_t(n), 0), begin{0, n}, rows;
  for (int64_t i = 0; i < n; ++i) pos.push_back(at + i);
  for (int64_t i = all_rows ? 0 : n - 1; i < n; ++i) rows.push_back(i);
  dsv4::SequenceCaches* const cs[1] = {caches};
  const dsv4::CachedTokens tk{pos.data(), seq.data(), begin.data(), 1, cs};
  dsv4gpu::DevMem dlog(rows.size() * size_t(V) * sizeof(float));
  model.impl().program->decode(ids.data(), tk, n, rows.data(), int64_t(rows.size()), dlog.as<float>());
  std::vector<float> out(rows.size() * size_t(V));
  TREX_CUDA(cudaMemcpy(out.data(), dlog.as<float>(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

TEST(CudaBackendDecode, PromptChunkThenTokensMatchTheUncachedModel) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny GPU decode config");
  const int64_t V = cfg.vocab_size, d = cfg.hidden;
  auto model = inference_model(cfg, 23);
  dsv4gpu::DecodeOptions o;
  o.slots = 2, o.max_context = 96;
  model->impl().backend->set_decode(o);
  std::unique_ptr<dsv4::SequenceCaches> a = model->impl().backend->new_caches();
  std::mt19937 g(5);
  std::vector<int32_t> seq;
  for (int i = 0; i < 60; ++i) seq.push_back(int32_t(2 + g() % uint32_t(V - 2)));
  // Uncached reference: the training model with the same weights (the same seed draws the same parameters).
  dsv4gpu::GpuModel full(cfg);
  full.init_random(23);
  const std::vector<std::vector<float>> ref = test::uncached_logits(full, seq, V, d);

  // The chunk wraps the 16-row window ring and ends inside a ratio-16 window: the decoded tokens complete
  // compressed entries of both ratios (and indexer keys) on top of the prefilled ones.
  const int64_t chunk = 37;
  const std::vector<int32_t> first(seq.begin(), seq.begin() + chunk);
  const std::vector<float> lp = decode(*model, a.get(), first, 0, true);
  std::vector<double> err;
  for (int64_t t = 0; t < chunk; ++t)
    err.push_back(test::row_err(std::vector<float>(lp.begin() + t * V, lp.begin() + (t + 1) * V), ref[size_t(t)]));
  for (int64_t t = chunk; t < int64_t(seq.size()); ++t)
    err.push_back(test::row_err(decode(*model, a.get(), {seq[size_t(t)]}, t, false), ref[size_t(t)]));
  std::vector<double> sorted = err;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2], worst = sorted.back();
  std::printf("decode through the program vs uncached forward: median row error %.4f, worst %.4f\n", median, worst);
  EXPECT_LT(median, 0.02);
  EXPECT_LT(worst, 0.1);
}

TEST(CudaBackendDecode, RefusesMissingCachesTooManySlotsAndForeignCaches) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny GPU decode config");
  auto m1 = inference_model(cfg, 1), m2 = inference_model(cfg, 2);
  EXPECT_THROW(m1->impl().backend->new_caches(), Error);  // before set_decode
  dsv4gpu::DecodeOptions o;
  o.slots = 1, o.max_context = 32;
  m1->impl().backend->set_decode(o);
  m2->impl().backend->set_decode(o);
  std::unique_ptr<dsv4::SequenceCaches> c1 = m1->impl().backend->new_caches();
  EXPECT_THROW(m1->impl().backend->new_caches(), Error);  // one slot only
  std::unique_ptr<dsv4::SequenceCaches> c2 = m2->impl().backend->new_caches();
  EXPECT_THROW(decode(*m1, c2.get(), {3, 4}, 0, false), Error);  // m2's slot on m1
  EXPECT_NO_THROW(decode(*m1, c1.get(), {3, 4}, 0, false));
}

}  // namespace
