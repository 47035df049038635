// Softmax cross-entropy over rows of logits [n, V] with integer targets (< 0 = ignored row).
#pragma once
#include <cmath>
#include <cstdint>

namespace trex::cpu {

// Writes lse[n] (log-sum-exp of each row) and returns the SUM of -log p[target] over the counted rows.
template <class T>
double cross_entropy_fwd(T* lse, const T* logits, const int32_t* targets, int64_t n, int64_t vocab) {
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n * vocab > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* z = logits + i * vocab;
    double mx = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) mx = std::fmax(mx, double(z[v]));
    double s = 0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(double(z[v]) - mx);
    const double l = mx + std::log(s);
    lse[i] = T(l);
    if (targets[i] >= 0) total += l - double(z[targets[i]]);
  }
  return total;
}

// dlogits[i] = scale * (softmax(z_i) - onehot(target_i)) for counted rows, 0 for ignored rows (written).
template <class T>
void cross_entropy_bwd(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t n, int64_t vocab,
                       double scale) {
#pragma omp parallel for schedule(static) if (n * vocab > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* z = logits + i * vocab;
    T* dz = dlogits + i * vocab;
    if (targets[i] < 0) {
      for (int64_t v = 0; v < vocab; ++v) dz[v] = T(0);
      continue;
    }
    const double l = double(lse[i]);
    for (int64_t v = 0; v < vocab; ++v) dz[v] = T(scale * std::exp(double(z[v]) - l));
    dz[targets[i]] -= T(scale);
  }
}

}  // namespace trex::cpu
