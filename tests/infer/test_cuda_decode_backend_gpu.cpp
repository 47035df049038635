// The CUDA backend's decode ops under the block program (model/cuda/cuda_backend.h, "Decoding"), below the engine:
// a decode pass of one sequence's prompt chunk and then single tokens gives the uncached GPU model's logits of the
// same positions within bf16 noise (the decode sites use the fused mHC kernel and a bf16 head collapse, the
// training forward the GEMM mixing path and an fp32 collapse: the engine's tolerance of
// TensorCoreAttentionAndGroupedExpertsMatchTheReferencePaths), and the backend refuses what
// would read the wrong memory: a decode pass before set_decode, more slots than it holds, another model's caches.
//
// Discrete choices. The router's top-k experts and the CSA indexer's top-k entries are chosen from bf16
// activations that differ between the two paths by rounding; where two candidates are within that noise the paths
// may choose differently, and one other expert (or compressed entry) moves the row, and through the caches the
// sequence's later rows, far outside noise. That is not a cache error, so the bound is held against the uncached
// model given the decode's own choices (Injection): every row must match it. What the choices themselves are is
// checked too: they equal the uncached model's own on most contested decisions (a wrong indexer key cache, rope
// position or visible range would change most of them), and a row far from the uncached model's own-choice logits
// must lie at or after the first token whose choice differed.
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

bool is_csa(dsv4gpu::GpuModel& m, int64_t l) { return m.impl().blocks[size_t(l)]->dims.type == dsv4::AttnType::CSA; }

// Router / indexer choices of a sequence, by layer, appended token by token: routed experts [t * topk], and on CSA
// layers the indexer's entries [t * index_topk] as entry indices of the sequence (-1 empty).
struct Choices {
  std::vector<std::vector<int32_t>> router;
  std::vector<std::vector<int64_t>> csa;
  explicit Choices(int64_t n_layers) : router(size_t(n_layers)), csa(size_t(n_layers)) {}
};

// Logits [n_rows, V] of one decode pass of `ids` appended to `caches` at position `at`, copied back; the pass's
// choices appended to `ch` when given.
std::vector<float> decode(dsv4gpu::GpuModel& model, dsv4::SequenceCaches* caches, const std::vector<int32_t>& ids,
                          int64_t at, bool all_rows, Choices* ch = nullptr) {
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
  if (ch) {
    dsv4gpu::CudaBackend& be = *model.impl().backend;
    const int64_t slot = dynamic_cast<const dsv4gpu::DecodeSlot&>(*caches).slot;
    for (int64_t l = 0; l < model.impl().cfg.n_layers; ++l) {
      const std::vector<int32_t> r = be.decode_router_selection(l);
      ch->router[size_t(l)].insert(ch->router[size_t(l)].end(), r.begin(), r.end());
      if (!is_csa(model, l)) continue;
      const int64_t cap = be.decode_caches().layer(l).cap;
      for (int64_t g : be.decode_csa_selection(l)) ch->csa[size_t(l)].push_back(g < 0 ? -1 : g - slot * cap);
    }
  }
  return out;
}

// Whether token t chose the same set (k per token) in a and b.
template <typename T>
bool same_set(const std::vector<T>& a, const std::vector<T>& b, int64_t t, int64_t k) {
  std::vector<T> x(a.begin() + t * k, a.begin() + (t + 1) * k), y(b.begin() + t * k, b.begin() + (t + 1) * k);
  std::sort(x.begin(), x.end()), std::sort(y.begin(), y.end());
  return x == y;
}

std::pair<double, double> median_worst(std::vector<double> e) {
  std::sort(e.begin(), e.end());
  return {e[e.size() / 2], e.back()};
}

TEST(CudaBackendDecode, PromptChunkThenTokensMatchTheUncachedModel) {
  const dsv4::ModelConfig cfg = trex::testing::tiny_gpu_config("tiny GPU decode config");
  const int64_t V = cfg.vocab_size, d = cfg.hidden, L = cfg.n_layers, K = cfg.topk, k = cfg.index_topk;
  auto model = inference_model(cfg, 23);
  dsv4gpu::DecodeOptions o;
  o.slots = 2, o.max_context = 96;
  model->impl().backend->set_decode(o);
  std::unique_ptr<dsv4::SequenceCaches> a = model->impl().backend->new_caches();
  std::mt19937 g(5);
  std::vector<int32_t> seq;
  for (int i = 0; i < 60; ++i) seq.push_back(int32_t(2 + g() % uint32_t(V - 2)));
  const int64_t S = int64_t(seq.size());
  // Uncached reference: the training model with the same weights (the same seed draws the same parameters), with
  // its own choices, which are read back.
  dsv4gpu::GpuModel full(cfg);
  full.init_random(23);
  const std::vector<std::vector<float>> ref_own = test::uncached_logits(full, seq, V, d);
  Choices own(L);
  for (int64_t l = 0; l < L; ++l) {
    own.router[size_t(l)] = full.router_selection(l);
    if (is_csa(full, l)) own.csa[size_t(l)] = full.csa_selection(l);
  }

  // The chunk wraps the 16-row window ring and ends inside a ratio-16 window: the decoded tokens complete
  // compressed entries of both ratios (and indexer keys) on top of the prefilled ones.
  const int64_t chunk = 37;
  Choices dec(L);
  std::vector<std::vector<float>> rows;
  const std::vector<int32_t> first(seq.begin(), seq.begin() + chunk);
  const std::vector<float> lp = decode(*model, a.get(), first, 0, true, &dec);
  for (int64_t t = 0; t < chunk; ++t) rows.emplace_back(lp.begin() + t * V, lp.begin() + (t + 1) * V);
  for (int64_t t = chunk; t < S; ++t) rows.push_back(decode(*model, a.get(), {seq[size_t(t)]}, t, false, &dec));

  // The uncached model again, given the decode's choices (hash layers route by token id: nothing to give).
  dsv4gpu::Injection inj;
  inj.router_sel.resize(size_t(L)), inj.csa_sel.resize(size_t(L));
  for (int64_t l = cfg.n_hash_layers(); l < L; ++l) inj.router_sel[size_t(l)] = dec.router[size_t(l)];
  for (int64_t l = 0; l < L; ++l)
    if (is_csa(full, l)) inj.csa_sel[size_t(l)] = dec.csa[size_t(l)];
  const std::vector<std::vector<float>> ref_same = test::uncached_logits(full, seq, V, d, &inj);

  // Contested decisions: every score-routed layer's router, and the indexer where a token sees more entries than
  // it selects (below that it takes them all).
  int64_t contested = 0, differ = 0, first_differ = S;
  for (int64_t t = 0; t < S; ++t)
    for (int64_t l = 0; l < L; ++l) {
      auto decision = [&](bool same, const char* what) {
        ++contested;
        if (same) return;
        ++differ, first_differ = std::min(first_differ, t);
        std::printf("  token %lld layer %lld: the decode's %s choice differs from the uncached model's own\n",
                    (long long)t, (long long)l, what);
      };
      if (l >= cfg.n_hash_layers()) decision(same_set(dec.router[size_t(l)], own.router[size_t(l)], t, K), "router");
      if (is_csa(full, l) && (t + 1) / cfg.compress_ratio[size_t(l)] > k)
        decision(same_set(dec.csa[size_t(l)], own.csa[size_t(l)], t, k), "indexer");
    }
  std::vector<double> err_same, err_own;
  int64_t far_own = 0;
  for (int64_t t = 0; t < S; ++t) {
    err_same.push_back(test::row_err(rows[size_t(t)], ref_same[size_t(t)]));
    err_own.push_back(test::row_err(rows[size_t(t)], ref_own[size_t(t)]));
    if (err_own.back() < 0.1) continue;
    ++far_own;
    EXPECT_GE(t, first_differ) << "row " << t << " is " << err_own.back() << " from the uncached model's logits "
                               << "before any router / indexer choice differs";
  }
  const auto [med_same, worst_same] = median_worst(err_same);
  const auto [med_own, worst_own] = median_worst(err_own);
  std::printf("decode through the program vs uncached forward with the decode's choices: median row error %.4f, "
              "worst %.4f; with its own choices: median %.4f, worst %.4f, %lld rows above 0.1; %lld of %lld "
              "contested choices differ (first at token %lld)\n",
              med_same, worst_same, med_own, worst_own, (long long)far_own, (long long)differ, (long long)contested,
              (long long)first_differ);
  EXPECT_LT(med_same, 0.02);
  EXPECT_LT(worst_same, 0.1);
  EXPECT_LT(med_own, 0.02);
  EXPECT_LE(5 * differ, contested) << "the decode's router / indexer choices differ from the uncached model's on "
                                      "more than a fifth of the contested decisions: not bf16 near-ties";
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
