// Sampling: determinism by seed, temperature and top-p against the exact distributions, top_p -> 0 and
// temperature 0 equal greedy, and the same on the tiny model end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "infer/generate.h"
#include "infer/sampler.h"
#include "infer_test_util.h"

using namespace trex;
using namespace trex::infer;

namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 0.5f, 2.5f, -1.0f, 2.9f};

std::vector<double> softmax(const std::vector<float>& z, double t) {
  std::vector<double> p(z.size());
  double mx = -INFINITY, s = 0;
  for (float v : z) mx = std::max(mx, double(v) / t);
  for (size_t i = 0; i < z.size(); ++i) s += p[i] = std::exp(double(z[i]) / t - mx);
  for (double& v : p) v /= s;
  return p;
}

std::vector<double> frequencies(Sampler& s, int n) {
  std::vector<double> f(kLogits.size(), 0.0);
  for (int i = 0; i < n; ++i) f[size_t(s.sample(kLogits.data(), int64_t(kLogits.size())))] += 1.0 / n;
  return f;
}

TEST(Sampler, SameSeedSameDrawsDifferentSeedDifferentDraws) {
  Sampler a({1.0, 1.0, 42}), b({1.0, 1.0, 42}), c({1.0, 1.0, 43});
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(kLogits.data(), 6));
    db.push_back(b.sample(kLogits.data(), 6));
    dc.push_back(c.sample(kLogits.data(), 6));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

TEST(Sampler, TemperatureMatchesSoftmaxOfScaledLogits) {
  const int n = 40000;
  for (double t : {0.5, 1.0, 2.0}) {
    Sampler s({t, 1.0, 7});
    const auto f = frequencies(s, n);
    const auto p = softmax(kLogits, t);
    for (size_t i = 0; i < p.size(); ++i)  // 5 standard deviations of a binomial frequency
      EXPECT_NEAR(f[i], p[i], 5 * std::sqrt(p[i] * (1 - p[i]) / n) + 1e-9) << "T " << t << " token " << i;
  }
}

TEST(Sampler, TopPKeepsTheSmallestNucleusRenormalised) {
  const auto p = softmax(kLogits, 1.0);  // order: 1 (3.0), 5 (2.9), 3 (2.5), 0, 2, 4
  ASSERT_LT(p[1] + p[5], 0.8);
  ASSERT_GT(p[1] + p[5] + p[3], 0.8);
  Sampler s({1.0, 0.8, 3});
  const int n = 40000;
  const auto f = frequencies(s, n);
  const double z = p[1] + p[5] + p[3];
  for (size_t i : {size_t(0), size_t(2), size_t(4)})
    EXPECT_EQ(f[i], 0.0) << "token " << i << " is outside the nucleus";
  for (size_t i : {size_t(1), size_t(5), size_t(3)}) {
    const double q = p[i] / z;
    EXPECT_NEAR(f[i], q, 5 * std::sqrt(q * (1 - q) / n)) << "token " << i;
  }
}

// A vocabulary-sized row whose nucleus is far larger than the sampler's first partially sorted head (1,024):
// every draw must come from the nucleus a full sort defines (ties by lower index), and draws must reach beyond the
// first 1,024 entries of that order (the head grew instead of truncating the nucleus).
TEST(Sampler, LargeNucleusBeyondThePartialSortHeadMatchesAFullSort) {
  const int64_t V = 20000;
  std::vector<float> z(static_cast<size_t>(V));
  uint64_t h = 12345;
  for (auto& v : z) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    v = float(double(h >> 40) / double(1ull << 24)) * 0.5f;  // nearly flat: the 0.6 nucleus holds ~11k tokens
  }
  const auto p = softmax(z, 1.0);
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
  std::vector<int> rank(static_cast<size_t>(V));
  size_t keep = 0;
  for (double mass = 0; keep < order.size();) {
    mass += p[size_t(order[keep])];
    rank[size_t(order[keep])] = int(keep);
    ++keep;
    if (mass >= 0.6) break;
  }
  ASSERT_GT(keep, size_t(4096)) << "the test needs a nucleus beyond two partial-sort heads";
  std::vector<bool> in(static_cast<size_t>(V), false);
  for (size_t k = 0; k < keep; ++k) in[size_t(order[k])] = true;
  Sampler s({1.0, 0.6, 5});
  int beyond_head = 0;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.sample(z.data(), V);
    ASSERT_TRUE(in[size_t(t)]) << "draw " << i << ": token " << t << " is outside the nucleus";
    beyond_head += rank[size_t(t)] >= 1024;
  }
  EXPECT_GT(beyond_head, 150) << "most of the nucleus lies beyond the first 1,024 entries";
}

TEST(Sampler, TinyTopPAndZeroTemperatureAreGreedy) {
  Sampler s({1.5, 1e-9, 11});
  Sampler g({0.0, 1.0, 11});
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(s.sample(kLogits.data(), 6), 1);
    EXPECT_EQ(g.sample(kLogits.data(), 6), 1);
  }
  EXPECT_EQ(argmax(kLogits.data(), 6), 1);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler({-0.1, 1.0, 0}), trex::Error);
  EXPECT_THROW(Sampler({1.0, 0.0, 0}), trex::Error);
  EXPECT_THROW(Sampler({1.0, 1.5, 0}), trex::Error);
  EXPECT_THROW(Sampler({NAN, 1.0, 0}), trex::Error);
}

TEST(SamplerModel, SeededCompletionRepeatsAndTopPToZeroEqualsGreedy) {
  auto model = load_inference_model(test::dsv4_fixture("tiny"));
  Decoder dec(*model);
  const std::vector<std::vector<int32_t>> prompts = {{0, 17, 99, 23, 180, 44, 7, 66}, {0, 5, 6, 7}};
  GenerateOptions go;
  go.max_new_tokens = 16;
  go.min_new_tokens = 16;
  go.sampling = {1.0, 1.0, 1234};
  const auto a = generate(dec, prompts, go);
  const auto b = generate(dec, prompts, go);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens);
  go.sampling.seed = 99;
  const auto c = generate(dec, prompts, go);
  EXPECT_TRUE(a[0].tokens != c[0].tokens || a[1].tokens != c[1].tokens)
      << "a different seed changes the draw";

  GenerateOptions greedy = go;
  greedy.sampling = {0.0, 1.0, 0};
  const auto g = generate(dec, prompts, greedy);
  GenerateOptions nucleus0 = go;
  nucleus0.sampling = {1.3, 1e-9, 5};
  const auto n0 = generate(dec, prompts, nucleus0);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(n0[i].tokens, g[i].tokens);
  // At temperature 1 the tiny (random-weight) model's distribution is broad: sampling differs from greedy.
  EXPECT_TRUE(a[0].tokens != g[0].tokens || a[1].tokens != g[1].tokens);
}

}  // namespace
