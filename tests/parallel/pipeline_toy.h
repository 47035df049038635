// A toy pipeline model for executor tests: L layers y = tanh(W x + b) on [rows, d] activations, a
// squared-error loss against fixed targets, cut into consecutive stages. The same deterministic weights
// and data on every rank, so each rank can compute the single-process reference itself.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "parallel/pipeline_stage.h"

namespace trex::test {

struct ToyPipeModel {
  int64_t layers = 8, d = 6, rows = 3, micro_batches = 4;
  std::vector<std::vector<float>> W, b;  // [layers] of d*d and d
  std::vector<std::vector<float>> X, Y;  // [micro_batches] inputs and targets, rows*d
  ToyPipeModel(int64_t L, int64_t d_, int64_t rows_, int64_t M, uint64_t seed) : layers(L), d(d_), rows(rows_), micro_batches(M) {
    uint64_t s = seed;
    auto u = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return float(double(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    };
    for (int64_t l = 0; l < L; ++l) {
      W.emplace_back(size_t(d * d));
      b.emplace_back(size_t(d));
      for (auto& w : W.back()) w = 0.6f * u();
      for (auto& x : b.back()) x = 0.1f * u();
    }
    for (int64_t m = 0; m < M; ++m) {
      X.emplace_back(size_t(rows * d));
      Y.emplace_back(size_t(rows * d));
      for (auto& x : X.back()) x = u();
      for (auto& y : Y.back()) y = 0.5f * u();
    }
  }
};

// Layers [l0, l1) of the toy model as one pipeline stage; its own copy of the weights and gradients.
class ToyStage : public parallel::PipelineStage {
 public:
  ToyStage(const ToyPipeModel& m, int64_t l0, int64_t l1, double loss_scale = 1.0)
      : m_(m), l0_(l0), l1_(l1), scale_(loss_scale) {
    for (int64_t l = l0; l < l1; ++l) {
      W_.push_back(m.W[size_t(l)]);
      b_.push_back(m.b[size_t(l)]);
      gW_.emplace_back(m.W[size_t(l)].size(), 0.0f);
      gb_.emplace_back(m.b[size_t(l)].size(), 0.0f);
    }
  }
  int64_t boundary_elems() const override { return m_.rows * m_.d; }
  bool is_first() const override { return l0_ == 0; }
  bool is_last() const override { return l1_ == m_.layers; }

  double forward(int64_t mb, const void* x_in_v, void* x_out) override {
    const float* x_in = static_cast<const float*>(x_in_v);
    const int64_t n = m_.rows * m_.d;
    std::vector<std::vector<float>>& acts = acts_[mb];
    acts.assign(1, std::vector<float>(is_first() ? m_.X[size_t(mb)].data() : x_in,
                                      (is_first() ? m_.X[size_t(mb)].data() : x_in) + n));
    for (size_t k = 0; k < W_.size(); ++k) {
      const std::vector<float>& x = acts.back();
      std::vector<float> y(static_cast<size_t>(n));
      for (int64_t r = 0; r < m_.rows; ++r)
        for (int64_t i = 0; i < m_.d; ++i) {
          float a = b_[k][size_t(i)];
          for (int64_t j = 0; j < m_.d; ++j) a += W_[k][size_t(i * m_.d + j)] * x[size_t(r * m_.d + j)];
          y[size_t(r * m_.d + i)] = std::tanh(a);
        }
      acts.push_back(std::move(y));
    }
    if (!is_last()) {
      std::memcpy(x_out, acts.back().data(), size_t(n) * sizeof(float));
      return 0.0;
    }
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double e = double(acts.back()[size_t(i)]) - double(m_.Y[size_t(mb)][size_t(i)]);
      loss += 0.5 * e * e;
    }
    return loss * scale_;
  }

  void backward(int64_t mb, const void* dx_out_v, void* dx_in) override {
    const float* dx_out = static_cast<const float*>(dx_out_v);
    const int64_t n = m_.rows * m_.d;
    auto it = acts_.find(mb);
    if (it == acts_.end()) throw std::runtime_error("toy stage: backward without forward");
    std::vector<std::vector<float>>& acts = it->second;
    std::vector<float> dy(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      dy[size_t(i)] = is_last() ? float(scale_ * (double(acts.back()[size_t(i)]) - double(m_.Y[size_t(mb)][size_t(i)])))
                                : dx_out[i];
    for (size_t k = W_.size(); k-- > 0;) {
      const std::vector<float>& x = acts[k];
      const std::vector<float>& y = acts[k + 1];
      std::vector<float> dx(static_cast<size_t>(n), 0.0f);
      for (int64_t r = 0; r < m_.rows; ++r)
        for (int64_t i = 0; i < m_.d; ++i) {
          const float da = dy[size_t(r * m_.d + i)] * (1.0f - y[size_t(r * m_.d + i)] * y[size_t(r * m_.d + i)]);
          gb_[k][size_t(i)] += da;
          for (int64_t j = 0; j < m_.d; ++j) {
            gW_[k][size_t(i * m_.d + j)] += da * x[size_t(r * m_.d + j)];
            dx[size_t(r * m_.d + j)] += da * W_[k][size_t(i * m_.d + j)];
          }
        }
      dy = std::move(dx);
    }
    if (!is_first()) std::memcpy(dx_in, dy.data(), size_t(n) * sizeof(float));
    acts_.erase(it);
  }

  int64_t first_layer() const { return l0_; }
  const std::vector<std::vector<float>>& grad_W() const { return gW_; }
  const std::vector<std::vector<float>>& grad_b() const { return gb_; }
  size_t live_micro_batches() const { return acts_.size(); }

 private:
  const ToyPipeModel& m_;
  int64_t l0_, l1_;
  double scale_;
  std::vector<std::vector<float>> W_, b_, gW_, gb_;
  std::map<int64_t, std::vector<std::vector<float>>> acts_;  // per micro-batch: stage input, then each layer's output
};

}  // namespace trex::test
