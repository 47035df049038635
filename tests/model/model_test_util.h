// Helpers shared by the whole-model tests: random parameters, router biases and hash tables for a Model<double>.
#pragma once
#include <random>
#include <string>

#include "model/dsv4/model.h"

namespace trex::dsv4::test {

// Norm weights near 1, everything else N(0, 0.4^2); router biases N(0, 0.1^2); each tid2eid row two distinct experts.
inline void init_random(Model<double>& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto& P = m.params();
  for (const auto& p : P.entries()) {
    double* v = P.arena_value(p);
    const bool is_norm = p.name.find("norm") != std::string::npos && p.shape.size() == 1;
    for (int64_t i = 0; i < p.numel; ++i) v[i] = is_norm ? 1.0 + 0.1 * nd(rng) : 0.4 * nd(rng);
  }
  for (auto& [name, b] : P.bias)
    for (auto& x : b) x = float(0.1 * nd(rng));
  std::uniform_int_distribution<int> ue(0, int(m.config().n_routed_experts) - 1);
  for (auto& [name, t] : P.tid2eid)
    for (size_t r = 0; r < t.size(); r += 2) {
      t[r] = ue(rng);
      do t[r + 1] = ue(rng);
      while (t[r + 1] == t[r]);
    }
}

}  // namespace trex::dsv4::test
