// DeepSeek-V4 attention sub-layer (CPU): RoPE tables, finite-difference gradients of every parameter
// and of the input (double), packed-vs-separate document equivalence, selection injection, indexer KL.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "model/dsv4/attention.h"

namespace trex::dsv4 {
namespace {

// d=16, 2 heads of 16 (rope 8), window 6, layers: sliding, CSA (ratio 4, top-3), HCA (ratio 8).
ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 32;
  c.hidden = 16;
  c.n_layers = 3;
  c.n_heads = 2;
  c.head_dim = 16;
  c.rope_dim = 8;
  c.q_lora_rank = 12;
  c.o_groups = 2;
  c.o_lora_rank = 8;
  c.window = 6;
  c.index_n_heads = 2;
  c.index_head_dim = 8;
  c.index_topk = 3;
  c.rms_eps = 1e-6;
  c.attn_types = {AttnType::Sliding, AttnType::CSA, AttnType::HCA};
  c.compress_ratio = {0, 4, 8};
  c.rope_main.theta = 10000.0;
  c.rope_compress.theta = 160000.0;
  c.rope_compress.yarn = true;
  c.rope_compress.factor = 4.0;
  c.rope_compress.original_max_position = 16;
  return c;
}

template <typename T>
struct LayerParams {
  std::vector<AttentionParamSpec> specs;
  std::vector<T> values, grads;
  AttentionParamsT<T> p, g;

  LayerParams(const ModelConfig& cfg, int64_t layer, uint64_t seed)
      : specs(attention_param_specs(cfg, layer)) {
    int64_t n = 0;
    for (const auto& s : specs) n += numel(s.shape);
    values.resize(static_cast<size_t>(n));
    grads.assign(size_t(n), T(0));
    EXPECT_EQ(bind_attention_params(p, specs, values.data()), n);
    bind_attention_params(g, specs, grads.data());
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (const auto& s : specs) {
      T* v = param_slot(p, s.slot);
      const bool is_norm = s.name.find("norm") != std::string::npos;
      const bool is_vec = s.shape.size() == 1 || s.name.find("ape") != std::string::npos;
      const double scale = is_vec ? 0.5 : 1.0 / std::sqrt(double(s.shape.back()));
      for (int64_t k = 0; k < numel(s.shape); ++k) v[k] = T(is_norm ? 1.0 + 0.2 * nd(rng) : scale * nd(rng));
    }
  }
  void zero_grads() { std::fill(grads.begin(), grads.end(), T(0)); }
  // Copy converted to another scalar type with the same values.
  template <typename U>
  void copy_values_to(LayerParams<U>& o) const {
    for (size_t k = 0; k < values.size(); ++k) o.values[k] = U(values[k]);
  }
};

std::vector<double> randn(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += a[k] * b[k];
  return s;
}

// Loss = <out, R> for a fixed random R; checks every parameter element and every input element against
// central differences. Selections are computed once and injected so that perturbations cannot flip them.
void fd_check_layer(int64_t layer, const SeqLayout& layout) {
  const ModelConfig cfg = small_config();
  AttentionLayerT<double> attn(cfg, layer);
  LayerParams<double> P(cfg, layer, 100 + uint64_t(layer));
  const int64_t N = layout.n_tokens(), d = cfg.hidden;
  std::vector<double> a = randn(size_t(N * d), 7), R = randn(size_t(N * d), 8), out(size_t(N * d));
  AttentionSaved<double> saved;
  attn.forward(P.p, a.data(), out.data(), layout, saved);
  const std::vector<int64_t> forced = saved.topk;
  AttentionOptions opts;
  opts.forced_topk = forced.empty() ? nullptr : forced.data();
  if (!forced.empty()) {
    int64_t valid = 0, empty = 0;
    for (int64_t v : forced) (v >= 0 ? valid : empty)++;
    EXPECT_GT(valid, 0);
    EXPECT_GT(empty, 0);  // early queries see fewer than k entries
  }
  auto loss = [&]() {
    AttentionSaved<double> s;
    std::vector<double> o(size_t(N * d));
    attn.forward(P.p, a.data(), o.data(), layout, s, opts);
    return dot(o, R);
  };
  attn.forward(P.p, a.data(), out.data(), layout, saved, opts);
  std::vector<double> da(size_t(N * d), 0.0);
  P.zero_grads();
  attn.backward(P.p, P.g, layout, saved, R.data(), da.data());

  // Central differences at up to `max_checks` elements per tensor (every element of small tensors).
  const double h = 1e-6;
  auto check = [&](const std::string& name, double* x, const double* analytic, int64_t n, size_t max_checks) {
    double worst = 0, gmax = 0;
    for (int64_t k = 0; k < n; ++k) gmax = std::max(gmax, std::abs(analytic[k]));
    EXPECT_GT(gmax, 0.0) << name << " got no gradient";
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) idx[size_t(k)] = k;
    std::mt19937_64 rng(uint64_t(n) * 31 + uint64_t(layer));
    std::shuffle(idx.begin(), idx.end(), rng);
    if (idx.size() > max_checks) idx.resize(max_checks);
    for (int64_t k : idx) {
      const double x0 = x[k];
      x[k] = x0 + h;
      const double lp = loss();
      x[k] = x0 - h;
      const double lm = loss();
      x[k] = x0;
      const double num = (lp - lm) / (2 * h);
      worst = std::max(worst, std::abs(num - analytic[k]) / std::max(1e-3, std::max(gmax, std::abs(num))));
    }
    EXPECT_LT(worst, 2e-6) << "layer " << layer << " " << name;
  };
  for (const auto& s : P.specs) {
    if (s.lm_grad) {
      check(s.name, param_slot(P.p, s.slot), param_slot(P.g, s.slot), numel(s.shape), 40);
    } else {  // indexer tensors: top-k is not differentiable, the LM loss gives them nothing
      const double* g = param_slot(P.g, s.slot);
      EXPECT_TRUE(std::all_of(g, g + numel(s.shape), [](double v) { return v == 0.0; })) << s.name;
    }
  }
  check("input a", a.data(), da.data(), N * d, 96);
}

TEST(AttentionRope, FixtureCompressTableAndPlainTable) {
  RopeParams yarn;
  yarn.theta = 160000.0;
  yarn.yarn = true;
  yarn.factor = 4.0;
  yarn.original_max_position = 64;
  const std::vector<double> expect = {1.0, 0.0125, 6.25e-4, 3.125e-5};  // fixture README
  const auto f = rope_inv_freq(yarn, 8);
  ASSERT_EQ(f.size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(f[k], expect[k], 1e-12 * expect[k] + 1e-15) << k;
  RopeParams plain;
  plain.theta = 10000.0;
  const auto g = rope_inv_freq(plain, 8);
  for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(g[k], std::pow(10000.0, -2.0 * double(k) / 8.0), 1e-15);
}

TEST(AttentionRope, FlashYarnRampLow15High25) {
  // Design §2.4.4: base 160000, D = 64, L0 = 65536, factor 16 -> pairs 0..15 unchanged, 25..31 / 16.
  RopeParams p;
  p.theta = 160000.0;
  p.yarn = true;
  p.factor = 16.0;
  p.original_max_position = 65536;
  const auto f = rope_inv_freq(p, 64);
  ASSERT_EQ(f.size(), 32u);
  for (int k = 0; k < 32; ++k) {
    const double base = std::pow(160000.0, -2.0 * k / 64.0);
    const double ramp = std::clamp((k - 15.0) / 10.0, 0.0, 1.0);
    EXPECT_NEAR(f[size_t(k)], base * (1 - ramp) + base / 16 * ramp, 1e-15) << k;
  }
  EXPECT_NEAR(f[15], std::pow(160000.0, -30.0 / 64.0), 1e-15);
  EXPECT_NEAR(f[25], std::pow(160000.0, -50.0 / 64.0) / 16, 1e-15);
}

TEST(AttentionRope, RotateInverseIsTranspose) {
  const auto inv = rope_inv_freq(RopeParams{}, 8);
  const auto tab = make_rope_table<double>(inv, 50);
  std::vector<double> x = randn(8, 3), y = x;
  rope_rotate(y.data(), tab.cos_at(37), tab.sin_at(37), 4, +1);
  EXPECT_NEAR(dot(x, x), dot(y, y), 1e-12);  // rotation preserves norms
  double moved = 0;
  for (size_t k = 0; k < 8; ++k) moved += std::abs(x[k] - y[k]);
  EXPECT_GT(moved, 1e-3);
  rope_rotate(y.data(), tab.cos_at(37), tab.sin_at(37), 4, -1);
  for (size_t k = 0; k < 8; ++k) EXPECT_NEAR(x[k], y[k], 1e-12);
}

TEST(AttentionSpecs, NamesShapesAndCounts) {
  const ModelConfig cfg = small_config();
  EXPECT_EQ(attention_param_specs(cfg, 0).size(), 8u);
  EXPECT_EQ(attention_param_specs(cfg, 2).size(), 12u);
  const auto csa = attention_param_specs(cfg, 1);
  ASSERT_EQ(csa.size(), 18u);
  EXPECT_EQ(csa[0].name, "attn.wq_a.weight");
  EXPECT_EQ(csa[5].shape, (Shape{16, 16}));  // wo_a [g*d_g, (n_h/g)*c]
  EXPECT_EQ(csa[8].name, "attn.compressor.wkv.weight");
  EXPECT_EQ(csa[8].shape, (Shape{32, 16}));  // overlapped: 2c rows
  EXPECT_EQ(csa[10].shape, (Shape{4, 32}));  // ape [m, 2c]
  EXPECT_EQ(csa[17].name, "attn.indexer.compressor.norm.weight");
  EXPECT_FALSE(csa[12].lm_grad);
  const auto hca = attention_param_specs(cfg, 2);
  EXPECT_EQ(hca[8].shape, (Shape{16, 16}));
  EXPECT_EQ(hca[10].shape, (Shape{8, 16}));
}

TEST(AttentionGrad, SlidingFiniteDifferences) {
  fd_check_layer(0, SeqLayout::unpacked(2, 19));
}
TEST(AttentionGrad, CsaFiniteDifferences) {
  fd_check_layer(1, SeqLayout::unpacked(2, 38));
}
TEST(AttentionGrad, HcaFiniteDifferences) {
  fd_check_layer(2, SeqLayout::unpacked(2, 37));
}
TEST(AttentionGrad, CsaPackedFiniteDifferences) {
  fd_check_layer(1, SeqLayout::packed(40, {{17, 23}, {9, 31}}));
}
TEST(AttentionGrad, HcaPackedFiniteDifferences) {
  fd_check_layer(2, SeqLayout::packed(40, {{19, 21}, {40}}));
}

// Runs one layer forward + backward (loss = <out, R>) on `layout`; returns out, da and the grads.
template <typename T>
struct RunResult {
  std::vector<T> out, da, grads;
  std::vector<int64_t> topk;
};

template <typename T>
RunResult<T> run_layer(const AttentionLayerT<T>& attn, LayerParams<T>& P, const SeqLayout& layout, const T* a,
                       const T* R, const AttentionOptions& opts = {}) {
  const int64_t n = layout.n_tokens() * attn.dims().d;
  RunResult<T> r;
  r.out.resize(static_cast<size_t>(n));
  r.da.assign(size_t(n), T(0));
  AttentionSaved<T> saved;
  attn.forward(P.p, a, r.out.data(), layout, saved, opts);
  P.zero_grads();
  attn.backward(P.p, P.g, layout, saved, R, r.da.data());
  r.grads = P.grads;
  r.topk = saved.topk;
  return r;
}

template <typename T>
double max_rel_diff(const std::vector<T>& x, const std::vector<T>& y) {
  double dmax = 0, ymax = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    dmax = std::max(dmax, std::abs(double(x[k]) - double(y[k])));
    ymax = std::max(ymax, std::abs(double(y[k])));
  }
  return dmax / std::max(ymax, 1e-30);
}

// A row packing documents of lengths `docs` must give exactly what the documents give as separate rows:
// outputs, input gradients, parameter gradients (summed) and, for CSA, the same selections.
template <typename T>
void packed_equals_separate(int64_t layer, const std::vector<int64_t>& docs, double tol) {
  const ModelConfig cfg = small_config();
  AttentionLayerT<T> attn(cfg, layer);
  LayerParams<T> P(cfg, layer, 300 + uint64_t(layer));
  const int64_t d = cfg.hidden, k = cfg.index_topk;
  int64_t T_row = 0;
  for (int64_t len : docs) T_row += len;
  const auto a64 = randn(size_t(T_row * d), 11), R64 = randn(size_t(T_row * d), 12);
  const std::vector<T> a(a64.begin(), a64.end()), R(R64.begin(), R64.end());
  const RunResult<T> packed = run_layer(attn, P, SeqLayout::packed(T_row, {docs}), a.data(), R.data());

  std::vector<T> out, da, grads(P.grads.size(), T(0));
  int64_t t0 = 0, entries_before = 0;
  for (int64_t len : docs) {
    const RunResult<T> sep =
        run_layer(attn, P, SeqLayout::unpacked(1, len), a.data() + t0 * d, R.data() + t0 * d);
    out.insert(out.end(), sep.out.begin(), sep.out.end());
    da.insert(da.end(), sep.da.begin(), sep.da.end());
    for (size_t q = 0; q < grads.size(); ++q) grads[q] += sep.grads[q];
    if (!sep.topk.empty()) {
      for (int64_t t = 0; t < len; ++t) {
        std::set<int64_t> want, got;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = sep.topk[size_t(t * k + j)];
          if (e >= 0) want.insert(e + entries_before);
          const int64_t g = packed.topk[size_t((t0 + t) * k + j)];
          if (g >= 0) got.insert(g);
        }
        EXPECT_EQ(got, want) << "document starting at " << t0 << ", token " << t;
      }
    }
    if (layer == 1) entries_before += len / cfg.compress_ratio[1];
    t0 += len;
  }
  EXPECT_LT(max_rel_diff(packed.out, out), tol) << "outputs";
  EXPECT_LT(max_rel_diff(packed.da, da), tol) << "input gradients";
  int64_t off = 0;
  for (const auto& s : P.specs) {
    const size_t n = size_t(numel(s.shape));
    const std::vector<T> gp(packed.grads.begin() + off, packed.grads.begin() + off + int64_t(n));
    const std::vector<T> gs(grads.begin() + off, grads.begin() + off + int64_t(n));
    if (s.lm_grad) {
      EXPECT_LT(max_rel_diff(gp, gs), tol) << s.name;
    }
    off += int64_t(n);
  }
}

// Documents shorter than a window, not multiples of either ratio, one long enough to need top-k.
const std::vector<int64_t> kDocs = {13, 18, 3, 11};

TEST(AttentionPacking, SlidingPackedEqualsSeparateRows) {
  packed_equals_separate<double>(0, kDocs, 1e-12);
}
TEST(AttentionPacking, CsaPackedEqualsSeparateRows) {
  packed_equals_separate<double>(1, kDocs, 1e-12);
}
TEST(AttentionPacking, HcaPackedEqualsSeparateRows) {
  packed_equals_separate<double>(2, kDocs, 1e-12);
}
TEST(AttentionPacking, CsaPackedEqualsSeparateRowsFloat) {
  packed_equals_separate<float>(1, kDocs, 2e-6);
}

TEST(AttentionPacking, PlanAlignsWindowsToDocuments) {
  const SeqLayout l = SeqLayout::packed(20, {{6, 9, 5}});
  const CompressPlan p = make_compress_plan(l, 4);
  ASSERT_EQ(p.n_entries, 4);  // 6 -> 1 window, 9 -> 2, 5 -> 1; trailing tokens dropped
  EXPECT_EQ(p.entry_first, (std::vector<int64_t>{0, 6, 10, 15}));
  EXPECT_EQ(p.entry_doc_index, (std::vector<int64_t>{0, 0, 1, 0}));
  EXPECT_EQ(p.tok_entry[4], -1);  // doc 0's trailing tokens belong to no entry
  EXPECT_EQ(p.tok_entry[14], -1);
  // Token 12 (offset 6 in doc 1) sees doc 1's first entry only; token 13 completes the second window.
  EXPECT_EQ(p.vis_begin[12], 1);
  EXPECT_EQ(p.vis_end[12], 2);
  EXPECT_EQ(p.vis_end[13], 3);
  EXPECT_EQ(p.vis_begin[5], 0);  // doc 0's last token: its one entry
  EXPECT_EQ(p.vis_end[5], 1);
  EXPECT_EQ(p.vis_end[2], 0);
  EXPECT_EQ(p.vis_begin[15], 3);  // doc 2 never sees doc 1's entries
  EXPECT_EQ(p.vis_end[17], 3);
  EXPECT_EQ(p.vis_end[18], 4);
  EXPECT_THROW(SeqLayout::packed(20, {{6, 9}}), Error);
}

TEST(AttentionSelection, InjectedSelectionsReplaceTheIndexer) {
  const ModelConfig cfg = small_config();
  AttentionLayerT<double> attn(cfg, 1);
  LayerParams<double> P(cfg, 1, 55);
  const SeqLayout layout = SeqLayout::unpacked(2, 36);
  const int64_t N = layout.n_tokens(), d = cfg.hidden, k = cfg.index_topk;
  const auto a = randn(size_t(N * d), 1), R = randn(size_t(N * d), 2);
  const RunResult<double> base = run_layer(attn, P, layout, a.data(), R.data());
  // Same sets in another slot order: identical results (order within a row carries no meaning).
  std::vector<int64_t> shuffled = base.topk;
  for (int64_t i = 0; i < N; ++i) std::reverse(shuffled.begin() + i * k, shuffled.begin() + (i + 1) * k);
  AttentionOptions opts;
  opts.forced_topk = shuffled.data();
  const RunResult<double> same = run_layer(attn, P, layout, a.data(), R.data(), opts);
  EXPECT_LT(max_rel_diff(same.out, base.out), 1e-14);
  EXPECT_LT(max_rel_diff(same.grads, base.grads), 1e-13);
  // A different visible selection changes the output.
  std::vector<int64_t> other(size_t(N * k), -1);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t n_vis = (i % 36 + 1) / 4;
    for (int64_t j = 0; j < std::min(k, n_vis); ++j) other[size_t(i * k + j)] = j;  // the oldest entries
  }
  opts.forced_topk = other.data();
  const RunResult<double> diff = run_layer(attn, P, layout, a.data(), R.data(), opts);
  EXPECT_GT(max_rel_diff(diff.out, base.out), 1e-3);
  EXPECT_EQ(diff.topk, other);
  // An entry the query cannot see is refused.
  other[size_t(10 * k)] = 5;  // token 10 sees entries 0, 1 only
  EXPECT_THROW(run_layer(attn, P, layout, a.data(), R.data(), opts), Error);
}

TEST(AttentionSelection, IndexerPicksTheBestVisibleScores) {
  // Brute force from the saved indexer tensors: the selected set is the top-k visible scores.
  const ModelConfig cfg = small_config();
  AttentionLayerT<double> attn(cfg, 1);
  LayerParams<double> P(cfg, 1, 77);
  const SeqLayout layout = SeqLayout::packed(40, {{22, 18}});
  const int64_t N = layout.n_tokens(), d = cfg.hidden, k = cfg.index_topk;
  const int64_t nI = cfg.index_n_heads, cI = cfg.index_head_dim;
  const auto a = randn(size_t(N * d), 3);
  std::vector<double> out(size_t(N * d));
  AttentionSaved<double> s;
  attn.forward(P.p, a.data(), out.data(), layout, s);
  for (int64_t i = 0; i < N; ++i) {
    std::vector<std::pair<double, int64_t>> sc;
    for (int64_t e = s.plan.vis_begin[size_t(i)]; e < s.plan.vis_end[size_t(i)]; ++e) {
      double tot = 0;
      for (int64_t h = 0; h < nI; ++h) {
        double u = 0;
        for (int64_t q = 0; q < cI; ++q)
          u += s.idx.q[size_t((i * nI + h) * cI + q)] * s.idx.keys[size_t(e * cI + q)];
        tot += s.idx.w[size_t(i * nI + h)] * std::max(u, 0.0) / std::sqrt(double(cI));
      }
      sc.push_back({-tot, e});
    }
    std::sort(sc.begin(), sc.end());
    std::set<int64_t> want, got;
    for (size_t j = 0; j < std::min(size_t(k), sc.size()); ++j) want.insert(sc[j].second);
    for (int64_t j = 0; j < k; ++j)
      if (s.sel[size_t(i * k + j)] >= 0) got.insert(s.sel[size_t(i * k + j)]);
    EXPECT_EQ(got, want) << "token " << i;
    EXPECT_EQ(int64_t(got.size()), std::min(k, s.plan.vis_end[size_t(i)] - s.plan.vis_begin[size_t(i)]));
  }
}

TEST(AttentionIndexerKl, GradientMatchesFiniteDifferencesAndStaysInTheIndexer) {
  const ModelConfig cfg = small_config();
  AttentionLayerT<double> attn(cfg, 1);
  LayerParams<double> P(cfg, 1, 91);
  const SeqLayout layout = SeqLayout::packed(40, {{29, 11}, {40}});
  const int64_t N = layout.n_tokens(), d = cfg.hidden;
  const auto a = randn(size_t(N * d), 5), R = randn(size_t(N * d), 6);
  const RunResult<double> plain = run_layer(attn, P, layout, a.data(), R.data());
  AttentionOptions opts;
  opts.forced_topk = plain.topk.data();  // fixed selection: the KL is then smooth in the indexer weights
  opts.indexer_kl = true;
  opts.indexer_kl_weight = 0.7;
  // LM-loss gradients are unchanged by switching the KL on.
  const RunResult<double> with_kl = run_layer(attn, P, layout, a.data(), R.data(), opts);
  EXPECT_LT(max_rel_diff(with_kl.da, plain.da), 1e-14);
  // KL alone (dout = 0): only indexer parameters receive gradient, and it matches central differences.
  const std::vector<double> zero(size_t(N * d), 0.0);
  std::vector<double> out(size_t(N * d)), da(size_t(N * d), 0.0);
  AttentionSaved<double> s;
  attn.forward(P.p, a.data(), out.data(), layout, s, opts);
  EXPECT_GT(s.indexer_kl_loss, 0.0);
  P.zero_grads();
  attn.backward(P.p, P.g, layout, s, zero.data(), da.data());
  EXPECT_TRUE(std::all_of(da.begin(), da.end(), [](double v) { return v == 0.0; }));
  auto kl = [&]() {
    AttentionSaved<double> t;
    std::vector<double> o(size_t(N * d));
    attn.forward(P.p, a.data(), o.data(), layout, t, opts);
    return t.indexer_kl_loss;
  };
  for (const auto& spec : P.specs) {
    double* x = param_slot(P.p, spec.slot);
    const double* g = param_slot(P.g, spec.slot);
    const int64_t n = numel(spec.shape);
    double gmax = 0;
    for (int64_t q = 0; q < n; ++q) gmax = std::max(gmax, std::abs(g[q]));
    if (spec.lm_grad) {
      EXPECT_EQ(gmax, 0.0) << spec.name;
      continue;
    }
    EXPECT_GT(gmax, 0.0) << spec.name;
    double worst = 0;
    for (int64_t q = 0; q < n; q += std::max<int64_t>(1, n / 24)) {
      const double x0 = x[q], h = 1e-6;
      x[q] = x0 + h;
      const double lp = kl();
      x[q] = x0 - h;
      const double lm = kl();
      x[q] = x0;
      worst = std::max(worst, std::abs((lp - lm) / (2 * h) - g[q]) / std::max(gmax, 1e-3));
    }
    EXPECT_LT(worst, 2e-6) << spec.name;
  }
}

}  // namespace
}  // namespace trex::dsv4
