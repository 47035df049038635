// Deterministic random numbers for the OR data generator. Every sample draws from its own stream,
// seeded from (run seed, sample index), so a sample does not depend on which worker made it or on
// how many samples came before it: the same seed gives the same bytes with any thread count.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace trex::orkit::gen {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(splitmix64(seed ^ 0x5DEECE66Dull)) {}
  uint64_t next() { return s_ = splitmix64(s_); }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0,1)
  int integer(int lo, int hi) {  // inclusive
    TREX_ASSERT(hi >= lo);
    return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  // A value in [lo, hi] rounded to `step` (e.g. 0.5, 0.01), so prose, tables and files show it exactly.
  double real(double lo, double hi, double step) {
    const double v = lo + uniform() * (hi - lo);
    return std::round(v / step) * step;
  }
  bool chance(double p) { return uniform() < p; }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    TREX_ASSERT(!v.empty());
    return v[next() % v.size()];
  }
  int weighted(const std::vector<double>& w) {
    double total = 0;
    for (double x : w) total += x;
    double r = uniform() * total;
    for (size_t i = 0; i < w.size(); ++i) {
      if (r < w[i]) return static_cast<int>(i);
      r -= w[i];
    }
    return static_cast<int>(w.size()) - 1;
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
  // k distinct elements of v in random order.
  template <typename T>
  std::vector<T> sample(std::vector<T> v, size_t k) {
    TREX_CHECK(k <= v.size(), "cannot draw {} distinct names from a pool of {}", k, v.size());
    shuffle(v);
    v.resize(k);
    return v;
  }

 private:
  uint64_t s_;
};

// The seed of sample `index` in a run with seed `run_seed`; kept below 2^53 so JSON readers see it exactly.
inline uint64_t sample_seed(uint64_t run_seed, uint64_t index) {
  return splitmix64(splitmix64(run_seed) ^ (index * 0xD1B54A32D192ED03ull)) & ((1ull << 53) - 1);
}

}  // namespace trex::orkit::gen
