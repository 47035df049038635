// The CUDA engine on the golden fixtures (tiny: 4 mHC streams, head dim 32; v4-tiny-b: 3 streams, head dim 48, 12
// indexer heads; v4-tiny-c: 2 streams, head dim 16 — the generic attention and mHC kernels, as in `trex parity
// --device cuda`). The engine runs the fixture's fp32 weights rounded to bf16 with bf16 activations. The fixture's
// reference selections (router, indexer) win by a relative margin of only 1e-4, far below bf16 resolution, so a
// bf16 model flips some of them (the fixture README: "judge it by statistics that allow rare flips, and say which
// you did"), and one flip moves a whole logits row. What is asserted, and why:
//  - greedy decoding (whole prompt in one step, and in chunks of 7) reproduces the reference's generate.output_ids,
//    except where the bf16 model itself decides otherwise: at a row's first differing token, the uncached GPU
//    training model (same bf16 weights and kernels, no caches) fed the reference's prefix must pick the engine's
//    token, or the fp32 CPU engine must rank the engine's token within kTieMargin of its best (a near-tie);
//  - teacher-forced on the reference's tokens, the engine's greedy choice equals the uncached GPU model's at
//    almost every generated position and its logits stay near the uncached model's and the fp32 CPU engine's
//    (bounds that catch a wrong kernel or cache, which moves every row, not a few flips; the numbers are printed);
//  - a fixed seed gives the same sampled completion twice, another seed a different one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "gpu_engine_test_util.h"
#include "infer/engine.h"
#include "infer/generate.h"
#include "infer_test_util.h"
#include "model/cuda/gpu_model.h"

namespace {

using namespace trex;
using namespace trex::infer;

constexpr double kTieMargin = 0.03;       // of the row's max |logit|: an argmax flip below this is bf16 noise
constexpr double kUncachedRowBound = 0.05;  // a logits row within bf16 noise: max |Δ| / max |ref| below this
constexpr double kMeanRowBound = 0.15;      // mean of that over the generated rows: a few flipped rows, not all

struct Loaded {
  std::shared_ptr<dsv4::Model<float>> model;
  std::vector<std::vector<int32_t>> prompts, expected;
};

Loaded load(const std::string& name) {
  const auto dir = test::dsv4_fixture(name);
  Loaded f;
  f.model = load_inference_model(dir);
  const ckpt::SafetensorsReader io(dir / "io.safetensors");
  f.prompts = test::int_rows(io, "generate.prompt_ids");
  f.expected = test::int_rows(io, "generate.output_ids");
  return f;
}

std::unique_ptr<Engine> gpu_engine(const Loaded& f) {
  CudaEngineOptions o;
  o.slots = int64_t(f.prompts.size());
  return make_cuda_engine(f.model->config(), &f.model->params(), o);
}

// Logits of the token after `seq` (fed as one prefill on slot 0 of a fresh engine state).
std::vector<float> next_logits(Engine& e, const std::vector<int32_t>& seq) {
  e.reset(0);
  std::vector<float> out;
  e.forward({EngineFeed{0, seq.data(), int64_t(seq.size())}}, out);
  return out;
}

// How far below the row's best logit `tok` lies, relative to the row's max |logit|.
double rel_margin(const std::vector<float>& row, int32_t tok) {
  const float best = *std::max_element(row.begin(), row.end());
  float scale = 0.f;
  for (float v : row) scale = std::max(scale, std::abs(v));
  return double(best - row[size_t(tok)]) / std::max(double(scale), 1e-9);
}

class GpuEngineFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuEngineFixture, GreedyDecodingReproducesReferenceOutputIds) {
  const Loaded f = load(GetParam());
  const dsv4::ModelConfig& cfg = f.model->config();
  const int64_t V = cfg.vocab_size;
  auto gpu = gpu_engine(f);
  auto cpu = make_cpu_engine(f.model, 1);
  dsv4gpu::GpuModel full(cfg);
  full.load_from(f.model->params());
  GenerateOptions go;
  go.max_new_tokens = int64_t(f.expected[0].size());
  go.min_new_tokens = go.max_new_tokens;  // the reference ran with min_new_tokens = max_new_tokens
  for (int64_t chunk : {int64_t(0), int64_t(7)}) {
    go.prefill_chunk = chunk;
    const auto out = generate(*gpu, f.prompts, go);
    ASSERT_EQ(out.size(), f.expected.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const auto& got = out[i].tokens;
      const auto& want = f.expected[i];
      ASSERT_EQ(got.size(), want.size());
      const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
      if (diff.first == got.end()) continue;
      const size_t j = size_t(diff.first - got.begin());
      std::vector<int32_t> prefix = f.prompts[i];
      prefix.insert(prefix.end(), want.begin(), want.begin() + std::ptrdiff_t(j));
      const std::vector<float> ref = next_logits(*cpu, prefix);
      const double margin = rel_margin(ref, *diff.first);
      const auto unc = test::uncached_logits(full, prefix, V, cfg.hidden);
      const int32_t unc_tok = argmax(unc.back().data(), V);
      std::printf("  %s row %zu (prefill chunk %lld): token %zu is %d, the reference's %d; the uncached GPU model "
                  "picks %d; the fp32 CPU engine ranks %d %.4f below its best\n",
                  GetParam().c_str(), i, (long long)chunk, j, *diff.first, *diff.second, unc_tok, *diff.first,
                  margin);
      EXPECT_TRUE(unc_tok == *diff.first || margin < kTieMargin)
          << GetParam() << " row " << i << " token " << j
          << ": the engine's greedy choice is neither the bf16 model's own (uncached) nor a near-tie of the fp32 model";
    }
  }
}

TEST_P(GpuEngineFixture, TeacherForcedLogitsMatchUncachedGpuModelAndCpuEngine) {
  const Loaded f = load(GetParam());
  const dsv4::ModelConfig& cfg = f.model->config();
  const int64_t V = cfg.vocab_size;
  auto gpu = gpu_engine(f);
  auto cpu = make_cpu_engine(f.model, int64_t(f.prompts.size()));
  // Both engines step through prompt + reference output together: the prompt in one step, then one token per
  // step for both rows (continuous batching of two slots), giving the logits of every generated position.
  const size_t B = f.prompts.size(), G = f.expected[0].size();
  for (size_t i = 0; i < B; ++i) gpu->reset(int64_t(i)), cpu->reset(int64_t(i));
  std::vector<std::vector<std::vector<float>>> eng(B), ref(B);  // [row][generated position] -> logits
  std::vector<float> lg, lc;
  for (size_t t = 0; t < G; ++t) {
    std::vector<EngineFeed> feeds;
    for (size_t i = 0; i < B; ++i) {
      if (t == 0)
        feeds.push_back({int64_t(i), f.prompts[i].data(), int64_t(f.prompts[i].size())});
      else
        feeds.push_back({int64_t(i), &f.expected[i][t - 1], 1});
    }
    gpu->forward(feeds, lg);
    cpu->forward(feeds, lc);
    ASSERT_EQ(lg.size(), B * size_t(V));
    for (size_t i = 0; i < B; ++i) {
      eng[i].emplace_back(lg.begin() + std::ptrdiff_t(i * V), lg.begin() + std::ptrdiff_t((i + 1) * V));
      ref[i].emplace_back(lc.begin() + std::ptrdiff_t(i * V), lc.begin() + std::ptrdiff_t((i + 1) * V));
    }
  }
  // The uncached GPU training model on each whole sequence: the engine's caches must reproduce it (same bf16
  // weights and kernels) to bf16 noise. Against the fp32 CPU engine the bf16 model differs by more (a router or
  // indexer near-tie that flips moves whole rows: the fixture README's rule), so that side is judged by its mean
  // and its greedy choices.
  dsv4gpu::GpuModel full(cfg);
  full.load_from(f.model->params());
  double worst_unc = 0, worst_cpu = 0, sum_cpu = 0, sum_unc = 0;
  int64_t rows = 0, far_unc = 0, same_cpu = 0, same_unc = 0, unc_is_ref = 0;
  for (size_t i = 0; i < B; ++i) {
    std::vector<int32_t> seq = f.prompts[i];
    seq.insert(seq.end(), f.expected[i].begin(), f.expected[i].end() - 1);
    const auto unc = test::uncached_logits(full, seq, V, cfg.hidden);
    for (size_t t = 0; t < G; ++t) {
      const auto& u = unc[f.prompts[i].size() - 1 + t];
      const double eu = test::row_err(eng[i][t], u), ec = test::row_err(eng[i][t], ref[i][t]);
      worst_unc = std::max(worst_unc, eu), worst_cpu = std::max(worst_cpu, ec), sum_cpu += ec, sum_unc += eu, ++rows;
      far_unc += eu > kUncachedRowBound;
      const int32_t te = argmax(eng[i][t].data(), V), tu = argmax(u.data(), V);
      same_cpu += te == argmax(ref[i][t].data(), V);
      same_unc += te == tu;
      unc_is_ref += tu == f.expected[i][t];
      if (eu > kUncachedRowBound || ec > 0.1)
        std::printf("  %s row %zu generated position %zu: engine vs uncached GPU model %.4f, vs fp32 CPU engine %.4f\n",
                    GetParam().c_str(), i, t, eu, ec);
    }
  }
  std::printf("  %s, %lld generated positions: engine vs uncached GPU model: argmax equal %lld, row error worst %.4f "
              "mean %.4f, %lld rows above %.2f; vs fp32 CPU engine: argmax equal %lld, worst %.4f, mean %.4f (of the "
              "row's max |logit|); uncached GPU model's argmax = reference token at %lld\n",
              GetParam().c_str(), (long long)rows, (long long)same_unc, worst_unc, sum_unc / double(rows),
              (long long)far_unc, kUncachedRowBound, (long long)same_cpu, worst_cpu, sum_cpu / double(rows),
              (long long)unc_is_ref);
  EXPECT_GE(double(same_unc), 0.8 * double(rows)) << "greedy choices of the engine vs the uncached GPU model";
  EXPECT_LT(sum_unc / double(rows), kMeanRowBound) << "mean distance to the uncached GPU model";
  EXPECT_LT(sum_cpu / double(rows), kMeanRowBound) << "mean distance to the fp32 CPU engine";
  for (size_t i = 0; i < B; ++i) EXPECT_EQ(gpu->slot_length(int64_t(i)), cpu->slot_length(int64_t(i)));
}

TEST_P(GpuEngineFixture, SeededSamplingRepeats) {
  const Loaded f = load(GetParam());
  auto gpu = gpu_engine(f);
  GenerateOptions go;
  go.max_new_tokens = 24;
  go.min_new_tokens = go.max_new_tokens;
  go.sampling.temperature = 1.0, go.sampling.top_p = 0.95, go.sampling.seed = 1234;
  const auto a = generate(*gpu, f.prompts, go);
  const auto b = generate(*gpu, f.prompts, go);
  go.sampling.seed = 99;
  const auto c = generate(*gpu, f.prompts, go);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << GetParam() << " row " << i << ": same seed, different completion";
    EXPECT_NE(a[i].tokens, c[i].tokens) << GetParam() << " row " << i << ": seeds 1234 and 99 sampled the same";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuEngineFixture, ::testing::Values("tiny", "v4-tiny-b", "v4-tiny-c"),
                         test::fixture_param_name);

}  // namespace
