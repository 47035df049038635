#include "train/toy_model.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "data/sampler.h"
#include "model/dsv4/loss.h"

namespace trex::train {

static void normal_fill(std::vector<float>& v, uint64_t& s, double std) {
  for (auto& x : v) {
    // Box-Muller on two splitmix draws: deterministic across platforms.
    double u1 = (double(data::splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double(data::splitmix64(s) >> 11) + 0.5) / 9007199254740992.0;
    x = float(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
}

ToyLM::ToyLM(int64_t vocab, int64_t hidden, uint64_t seed, double init_std)
    : V_(vocab), d_(hidden), embed_(size_t(vocab * hidden)), w_(size_t(hidden * hidden)),
      g_(size_t(hidden), 1.0f), head_(size_t(vocab * hidden)) {
  TREX_CHECK(vocab > 0 && hidden > 0, "toy model needs vocab > 0 and hidden > 0");
  uint64_t s = seed;
  normal_fill(embed_, s, 1.0);  // unit-scale embeddings so the first loss is informative
  normal_fill(w_, s, init_std * 10);
  normal_fill(head_, s, init_std);
  dembed_.assign(embed_.size(), 0.0f);
  dw_.assign(w_.size(), 0.0f);
  dg_.assign(g_.size(), 0.0f);
  dhead_.assign(head_.size(), 0.0f);
}

std::vector<optim::ParamRef> ToyLM::params() {
  using optim::ParamGroup;
  return {{"embed.weight", {V_, d_}, embed_.data(), dembed_.data(), ParamGroup::AdamW},
          {"layers.0.ffn.w1.weight", {d_, d_}, w_.data(), dw_.data(), ParamGroup::Muon},
          {"norm.weight", {d_}, g_.data(), dg_.data(), ParamGroup::AdamW},
          {"head.weight", {V_, d_}, head_.data(), dhead_.data(), ParamGroup::AdamW}};
}

void ToyLM::zero_grads() {
  for (auto* v : {&dembed_, &dw_, &dg_, &dhead_}) std::fill(v->begin(), v->end(), 0.0f);
}

double ToyLM::run(const data::Batch& b, bool backward) {
  const int64_t n = b.batch * b.seq;
  // The batch's labels are aligned with the ids (data/batch.h); the same one shift as the DeepSeek-V4 model's gives
  // each position its next-token target (a document's first label is -1, so no target crosses a document start).
  const std::vector<int32_t> next = dsv4::shifted_targets(b.labels.data(), nullptr, b.batch, b.seq, 1, V_);
  int64_t targets = 0;
  for (int64_t i = 0; i < n; ++i) targets += next[size_t(i)] >= 0;
  if (targets == 0) return 0.0;
  const double inv = 1.0 / double(targets);
  const size_t d = static_cast<size_t>(d_), V = static_cast<size_t>(V_);
  std::vector<float> z(d), a(d), th(d), logits(V), da(d), dz(d);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = next[size_t(i)];
    if (y < 0) continue;
    const int32_t x = b.input_ids[size_t(i)];
    TREX_CHECK(x >= 0 && x < V_ && y < V_, "toy model: token id {} / label {} outside vocab {}", x, y, V_);
    const float* h = embed_.data() + int64_t(x) * d_;
    for (int64_t r = 0; r < d_; ++r) {
      double s = 0;
      for (int64_t c = 0; c < d_; ++c) s += double(w_[size_t(r * d_ + c)]) * h[c];
      z[size_t(r)] = float(s);
      th[size_t(r)] = std::tanh(z[size_t(r)]);
      a[size_t(r)] = th[size_t(r)] * g_[size_t(r)] + h[r];
    }
    double mx = -1e300;
    for (int64_t v = 0; v < V_; ++v) {
      double s = 0;
      for (int64_t c = 0; c < d_; ++c) s += double(head_[size_t(v * d_ + c)]) * a[size_t(c)];
      logits[size_t(v)] = float(s);
      mx = std::max(mx, s);
    }
    double se = 0;
    for (int64_t v = 0; v < V_; ++v) se += std::exp(double(logits[size_t(v)]) - mx);
    const double lse = mx + std::log(se);
    total += lse - double(logits[size_t(y)]);
    if (!backward) continue;
    std::fill(da.begin(), da.end(), 0.0f);
    for (int64_t v = 0; v < V_; ++v) {
      const float dl = float((std::exp(double(logits[size_t(v)]) - lse) - (v == y ? 1.0 : 0.0)) * inv);
      float* dh = dhead_.data() + v * d_;
      const float* hv = head_.data() + v * d_;
      for (int64_t c = 0; c < d_; ++c) {
        dh[c] += dl * a[size_t(c)];
        da[size_t(c)] += dl * hv[c];
      }
    }
    float* de = dembed_.data() + int64_t(x) * d_;
    for (int64_t r = 0; r < d_; ++r) {
      dg_[size_t(r)] += da[size_t(r)] * th[size_t(r)];
      dz[size_t(r)] = da[size_t(r)] * g_[size_t(r)] * (1.0f - th[size_t(r)] * th[size_t(r)]);
      de[r] += da[size_t(r)];  // residual path
    }
    for (int64_t r = 0; r < d_; ++r)
      for (int64_t c = 0; c < d_; ++c) {
        dw_[size_t(r * d_ + c)] += dz[size_t(r)] * h[c];
        de[c] += w_[size_t(r * d_ + c)] * dz[size_t(r)];
      }
  }
  return total * inv;
}

StepStats ToyLM::forward_backward(const data::Batch& b) {
  StepStats s;
  s.loss = run(b, true);
  s.n_targets = b.n_targets;
  s.parts["lm"] = s.loss;
  return s;
}

double ToyLM::loss(const data::Batch& b) const { return const_cast<ToyLM*>(this)->run(b, false); }

double ToyLM::flops_per_token(int64_t) const { return 3.0 * 2.0 * double(d_ * d_ + V_ * d_); }

std::string ToyLM::describe() const {
  return fmt::format("toy LM (vocab {}, hidden {}, {} parameters)", V_, d_, 2 * V_ * d_ + d_ * d_ + d_);
}

}  // namespace trex::train
