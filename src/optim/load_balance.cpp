#include "optim/load_balance.h"

#include <vector>

#include "core/error.h"

namespace trex::optim {

void update_router_bias(float* bias, const float* load, int64_t n, double speed) {
  double mean = 0;
  for (int64_t e = 0; e < n; ++e) mean += load[e];
  mean /= double(n);
  for (int64_t e = 0; e < n; ++e) {
    const double d = mean - double(load[e]);
    bias[e] += float(speed * double((d > 0) - (d < 0)));
  }
}

double seq_balance_loss(const float* s, const int32_t* sel, int64_t T, int64_t E, int64_t K, double alpha,
                        float* grad) {
  if (T == 0) return 0.0;
  std::vector<double> f(size_t(E), 0.0), p(size_t(E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = sel[t * K + k];
      TREX_CHECK(e >= 0 && e < E, "seq_balance_loss: expert id {} out of range [0, {})", e, E);
      f[size_t(e)] += 1.0;
    }
  for (auto& x : f) x *= double(E) / double(K * T);
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += s[t * E + e];
    double fs = 0;
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] += s[t * E + e] / sum;
      fs += f[size_t(e)] * s[t * E + e];
    }
    if (grad) {
      // d/ds_j (s_e / S) summed with weights f_e: (f_j S - sum_e f_e s_e) / S^2
      for (int64_t e = 0; e < E; ++e)
        grad[t * E + e] += float(alpha / double(T) * (f[size_t(e)] * sum - fs) / (sum * sum));
    }
  }
  double loss = 0;
  for (int64_t e = 0; e < E; ++e) loss += f[size_t(e)] * p[size_t(e)] / double(T);
  return alpha * loss;
}

}  // namespace trex::optim
