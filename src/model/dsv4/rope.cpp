#include "model/dsv4/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace trex::dsv4 {

// Design §2.4.4 / transformers' YaRN: with D = rope_dim, base frequencies theta_k = base^(-2k/D);
// the correction range [low, high] is computed in full-dimension units, but the ramp is indexed by
// pair k (0 .. D/2-1); ramp 0 keeps theta_k, ramp 1 divides it by the factor. No attention scale.
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rope_dim) {
  TREX_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope_inv_freq: rope_dim {} must be positive and even",
             rope_dim);
  TREX_CHECK(p.theta > 1.0, "rope_inv_freq: rope theta {} must be > 1", p.theta);
  const int64_t n_pairs = rope_dim / 2;
  const double D = double(rope_dim);
  std::vector<double> inv(static_cast<size_t>(n_pairs));
  for (int64_t k = 0; k < n_pairs; ++k) inv[size_t(k)] = 1.0 / std::pow(p.theta, double(2 * k) / D);
  if (!p.yarn) return inv;
  TREX_CHECK(p.factor > 0.0, "rope_inv_freq: YaRN factor {} must be positive", p.factor);
  TREX_CHECK(p.original_max_position > 0, "rope_inv_freq: YaRN needs original_max_position > 0 (got {})",
             p.original_max_position);
  const double L0 = double(p.original_max_position);
  auto corr = [&](double n_rot) {
    return D * std::log(L0 / (n_rot * 2.0 * std::numbers::pi)) / (2.0 * std::log(p.theta));
  };
  double low = std::max(std::floor(corr(p.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(p.beta_slow)), D - 1.0);
  if (low == high) high += 0.001;  // the reference's guard against a zero-width ramp
  for (int64_t k = 0; k < n_pairs; ++k) {
    const double ramp = std::clamp((double(k) - low) / (high - low), 0.0, 1.0);
    const double theta = inv[size_t(k)];
    inv[size_t(k)] = theta * (1.0 - ramp) + theta / p.factor * ramp;
  }
  return inv;
}

template <typename T>
RopeTable<T> make_rope_table(const std::vector<double>& inv_freq, int64_t n_pos) {
  RopeTable<T> t;
  t.n_pairs = int64_t(inv_freq.size());
  t.n_pos = n_pos;
  t.cos.resize(size_t(n_pos * t.n_pairs));
  t.sin.resize(size_t(n_pos * t.n_pairs));
  for (int64_t p = 0; p < n_pos; ++p)
    for (int64_t k = 0; k < t.n_pairs; ++k) {
      const float angle = float(inv_freq[size_t(k)]) * float(p);
      t.cos[size_t(p * t.n_pairs + k)] = T(std::cos(double(angle)));
      t.sin[size_t(p * t.n_pairs + k)] = T(std::sin(double(angle)));
    }
  return t;
}

template RopeTable<float> make_rope_table<float>(const std::vector<double>&, int64_t);
template RopeTable<double> make_rope_table<double>(const std::vector<double>&, int64_t);

}  // namespace trex::dsv4
