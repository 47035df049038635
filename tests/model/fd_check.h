// Central finite-difference gradient checks in double for the model's hand-written backward passes.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace trex::test {

inline std::vector<double> randn(size_t n, std::mt19937_64& rng, double scale = 1.0, double mean = 0.0) {
  std::normal_distribution<double> nd(mean, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Compares analytic[i] with (L(x+h e_i) - L(x-h e_i)) / 2h at up to max_checks indices (all when fewer).
// Returns the worst error relative to max(|analytic|, |numeric|, floor).
inline double fd_check(const std::string& name, std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, double tol = 1e-6, size_t max_checks = 48,
                       double h = 1e-5, double floor = 1e-3, uint64_t seed = 7) {
  EXPECT_EQ(x.size(), analytic.size()) << name;
  std::vector<size_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  if (idx.size() > max_checks) {
    std::mt19937_64 rng(seed);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(max_checks);
  }
  double worst = 0;
  bool any_nonzero = false;
  for (size_t i : idx) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    const double num = (lp - lm) / (2 * h);
    const double err = std::fabs(num - analytic[i]) / std::max({std::fabs(num), std::fabs(analytic[i]), floor});
    if (std::fabs(num) > 1e-9) any_nonzero = true;
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << name << "[" << i << "]: analytic " << analytic[i] << " numeric " << num;
  }
  EXPECT_TRUE(any_nonzero) << name << ": every checked derivative is zero, the check is vacuous";
  return worst;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace trex::test
