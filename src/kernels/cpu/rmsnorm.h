// RMSNorm over the last dim, forward and backward, for float and double:
//   y = w * x / sqrt(mean(x^2) + eps)   (w may be null: unweighted)
// Reductions accumulate in double. Rows are independent (OpenMP over rows).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace trex::cpu {

// rstd[n] receives 1/sqrt(mean(x^2)+eps) for the backward pass (may be null).
template <class T>
void rmsnorm_fwd(T* y, T* rstd, const T* x, const T* w, int64_t n, int64_t d, double eps) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    T* yi = y + i * d;
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(xi[j]) * double(xi[j]);
    const T r = T(1.0 / std::sqrt(ss / double(d) + eps));
    if (rstd) rstd[i] = r;
    if (w) {
      for (int64_t j = 0; j < d; ++j) yi[j] = w[j] * (xi[j] * r);
    } else {
      for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * r;
    }
  }
}

// dx[n,d] += d/dx (accumulates); dw[d] += sum over rows of dy * x * rstd (when dw and w are given).
template <class T>
void rmsnorm_bwd(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t n, int64_t d) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    const T* dyi = dy + i * d;
    T* dxi = dx + i * d;
    const double r = double(rstd[i]);
    double dot = 0;  // sum_j (w_j dy_j) x_j
    for (int64_t j = 0; j < d; ++j) dot += double(w ? w[j] * dyi[j] : dyi[j]) * double(xi[j]);
    const double c = dot * r * r * r / double(d);
    for (int64_t j = 0; j < d; ++j) {
      const double g = w ? double(w[j]) * double(dyi[j]) : double(dyi[j]);
      dxi[j] += T(r * g - c * double(xi[j]));
    }
  }
  if (dw && w) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
    for (int64_t j = 0; j < d; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += double(dy[i * d + j]) * double(x[i * d + j]) * double(rstd[i]);
      dw[j] += T(acc);
    }
  }
}

}  // namespace trex::cpu
