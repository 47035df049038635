#include "model/dsv4/balance.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace trex::dsv4 {

template <class T>
double balance_loss(const T* scores, const int32_t* sel, int64_t B, int64_t T_, int64_t E, int64_t K, double alpha,
                    T* dscores) {
  if (dscores)
    for (int64_t i = 0; i < B * T_ * E; ++i) dscores[i] = T(0);
  if (alpha == 0.0 || B == 0 || T_ == 0) return 0.0;
  double total = 0;
  std::vector<double> f(static_cast<size_t>(E)), P(static_cast<size_t>(E));
  for (int64_t b = 0; b < B; ++b) {
    std::fill(f.begin(), f.end(), 0.0);
    std::fill(P.begin(), P.end(), 0.0);
    for (int64_t t = b * T_; t < (b + 1) * T_; ++t) {
      for (int64_t k = 0; k < K; ++k) f[size_t(sel[t * K + k])] += 1.0;
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += double(scores[t * E + e]);
      for (int64_t e = 0; e < E; ++e) P[size_t(e)] += double(scores[t * E + e]) / s;
    }
    double lb = 0;
    for (int64_t e = 0; e < E; ++e) {
      f[size_t(e)] *= double(E) / double(K * T_);
      P[size_t(e)] /= double(T_);
      lb += f[size_t(e)] * P[size_t(e)];
    }
    total += alpha * lb / double(B);
    if (!dscores) continue;
    // dL/dp_{t,e} = alpha f_e / (B T); p = s / sum(s)  =>  ds_e = (dp_e - sum_e' dp_e' p_e') / sum(s)
    for (int64_t t = b * T_; t < (b + 1) * T_; ++t) {
      double s = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) s += double(scores[t * E + e]);
      for (int64_t e = 0; e < E; ++e) dot += alpha * f[size_t(e)] / double(B * T_) * double(scores[t * E + e]) / s;
      for (int64_t e = 0; e < E; ++e) dscores[t * E + e] = T((alpha * f[size_t(e)] / double(B * T_) - dot) / s);
    }
  }
  return total;
}

template double balance_loss<float>(const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double, float*);
template double balance_loss<double>(const double*, const int32_t*, int64_t, int64_t, int64_t, int64_t, double,
                                     double*);

}  // namespace trex::dsv4
