#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace trex::infer {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

void validate(const SamplingParams& p) {
  TREX_CHECK(p.temperature == 0.0 || (p.temperature >= kMinTemperature && p.temperature <= 100.0),
             "temperature must be 0 (greedy) or in [{}, 100], got {}", kMinTemperature, p.temperature);
  TREX_CHECK(std::isfinite(p.top_p) && p.top_p > 0.0 && p.top_p <= 1.0, "top_p must be in (0, 1], got {}",
             p.top_p);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), state_(p.seed ^ 0x9E3779B97F4A7C15ull) {
  validate(p);
}

double Sampler::uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  TREX_CHECK(n > 0, "sampler: empty logits");
  if (p_.temperature == 0.0) return argmax(logits, n);
  // Probabilities at temperature T, in double.
  const double inv_t = 1.0 / p_.temperature;
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]) * inv_t);
  std::vector<double> prob(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob[size_t(i)] = std::exp(double(logits[i]) * inv_t - mx);
  if (p_.top_p >= 1.0) {
    // No nucleus: the inverse CDF over the whole vocabulary in index order (no sort of the 129k entries).
    const double u = uniform() * sum;
    double acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc += prob[size_t(i)];
      if (u < acc) return int32_t(i);
    }
    return int32_t(n - 1);
  }
  // Nucleus: the shortest prefix, by decreasing probability (ties: lower index first), whose mass reaches top_p
  // (always at least one token). Only that prefix is ordered: partial sorts of a growing head (1,024, 4,096, ...
  // entries) until the head holds the nucleus, which is the same prefix a full sort gives.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return prob[size_t(a)] > prob[size_t(b)] || (prob[size_t(a)] == prob[size_t(b)] && a < b);
  };
  size_t keep = 0;
  for (size_t head = std::min<size_t>(1024, order.size());;
       head = head * 4 >= order.size() / 2 ? order.size() : head * 4) {  // past half: one full sort
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(head), order.end(), before);
    keep = 0;
    double mass = 0;
    bool reached = false;
    while (keep < head) {
      mass += prob[size_t(order[keep])] / sum;
      ++keep;
      if (mass >= p_.top_p) {
        reached = true;
        break;
      }
    }
    if (reached || head == order.size()) break;
  }
  double kept = 0;
  for (size_t k = 0; k < keep; ++k) kept += prob[size_t(order[k])];
  const double u = uniform() * kept;
  double acc = 0;
  for (size_t k = 0; k < keep; ++k) {
    acc += prob[size_t(order[k])];
    if (u < acc) return order[k];
  }
  return order[keep - 1];
}

}  // namespace trex::infer
