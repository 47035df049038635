// The CPU attention's CSA selections against the golden fixture (transformers 5.17, float64): the
// indexer_topk of layers 1 and 3 for every query. The attention input is rebuilt from the fixture's
// streams entering the layer (mHC collapse + attn_norm). This checks the q path up to c_Q, the
// indexer's overlapped compressor, its RoPE table (YaRN), the scoring, the visibility rule and top-k.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/files.h"
#include "model/dsv4/attention.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/naming.h"

namespace trex::dsv4 {
namespace {

std::vector<float> load_f32(const ckpt::SafetensorsReader& r, const std::string& name, const Shape& shape) {
  const TensorView v = r.view(name);
  EXPECT_EQ(v.shape, shape) << name;
  const float* p = v.f32();
  return std::vector<float>(p, p + v.numel());
}

TEST(AttentionFixture, CsaSelectionsMatchTheReference) {
  const std::filesystem::path dir = shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  if (!std::filesystem::exists(dir / "io.safetensors")) GTEST_SKIP() << "no fixture at " << dir;
  const ModelConfig cfg = load_model_config(dir / "config.json");
  const ckpt::SafetensorsReader model(dir / "model.safetensors"), io(dir / "io.safetensors");
  const int64_t B = 2, S = 160, d = cfg.hidden, n_hc = cfg.hc_mult, N = B * S;
  int checked_layers = 0;
  for (int64_t layer = 0; layer < cfg.n_layers; ++layer) {
    if (cfg.attn_types[size_t(layer)] != AttnType::CSA) continue;
    ++checked_layers;
    const std::string pre = "layers." + std::to_string(layer) + ".";
    // Attention input: collapse the streams with the layer's attention mHC site, then attn_norm.
    const auto X = load_f32(io, "hidden_states." + std::to_string(layer), {B, S, n_hc, d});
    MhcShape ms;
    ms.n_tok = N;
    ms.n_hc = n_hc;
    ms.d = d;
    ms.sinkhorn_iters = cfg.hc_sinkhorn_iters;
    ms.hc_eps = cfg.hc_eps;
    ms.rms_eps = cfg.rms_eps;
    const auto fn = load_f32(model, official_to_transformers(pre + "hc_attn_fn"), {ms.n_mix(), n_hc * d});
    const auto base = load_f32(model, official_to_transformers(pre + "hc_attn_base"), {ms.n_mix()});
    const auto scale = load_f32(model, official_to_transformers(pre + "hc_attn_scale"), {3});
    std::vector<float> mix(size_t(N * ms.n_mix())), rstd(static_cast<size_t>(N)), pw(size_t(N * n_hc)),
        post(size_t(N * n_hc)), comb(size_t(N * n_hc * n_hc)), x(size_t(N * d));
    MhcSiteActs<float> acts{mix.data(), rstd.data(), pw.data(), post.data(), comb.data()};
    mhc_site_fwd(ms, X.data(), fn.data(), base.data(), scale.data(), acts, x.data());
    const auto norm_w = load_f32(model, official_to_transformers(pre + "attn_norm.weight"), {d});
    std::vector<float> a(size_t(N * d));
    for (int64_t t = 0; t < N; ++t) {
      double ss = 0;
      for (int64_t k = 0; k < d; ++k) ss += double(x[size_t(t * d + k)]) * x[size_t(t * d + k)];
      const float r = float(1.0 / std::sqrt(ss / double(d) + cfg.rms_eps));
      for (int64_t k = 0; k < d; ++k) a[size_t(t * d + k)] = norm_w[size_t(k)] * (x[size_t(t * d + k)] * r);
    }
    // Parameters, by official name through the transformers renaming.
    const auto specs = attention_param_specs(cfg, layer);
    int64_t total = 0;
    for (const auto& s : specs) total += numel(s.shape);
    std::vector<float> values(static_cast<size_t>(total));
    AttentionParams p;
    bind_attention_params(p, specs, values.data());
    for (const auto& s : specs) {
      const auto v = load_f32(model, official_to_transformers(pre + s.name), s.shape);
      std::copy(v.begin(), v.end(), param_slot(p, s.slot));
    }
    AttentionLayer attn(cfg, layer);
    AttentionSaved<float> saved;
    std::vector<float> out(size_t(N * d));
    attn.forward(p, a.data(), out.data(), SeqLayout::unpacked(B, S), saved);

    const int64_t k = cfg.index_topk;
    const TensorView ref = io.view("indexer_topk." + std::to_string(layer));
    ASSERT_EQ(ref.shape, (Shape{B, S, k}));
    const int64_t* want = ref.as<const int64_t>();
    int64_t mismatched = 0;
    for (int64_t i = 0; i < N; ++i) {
      std::set<int64_t> w, g;
      for (int64_t j = 0; j < k; ++j) {
        if (want[i * k + j] >= 0) w.insert(want[i * k + j]);
        if (saved.topk[size_t(i * k + j)] >= 0) g.insert(saved.topk[size_t(i * k + j)]);
      }
      if (w != g && ++mismatched <= 3)
        ADD_FAILURE() << "layer " << layer << " row " << i / S << " token " << i % S;
    }
    EXPECT_EQ(mismatched, 0) << "layer " << layer;
  }
  EXPECT_EQ(checked_layers, 2);
}

}  // namespace
}  // namespace trex::dsv4
