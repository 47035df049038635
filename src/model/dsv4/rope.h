// Partial interleaved RoPE (design §2.4.4): the last r dims of a vector form r/2 pairs
// (x[2k], x[2k+1]) rotated by angle pos * inv_freq[k]. rope_inv_freq (declared in config.h) builds
// the per-pair frequencies, with YaRN as the reference computes it.
#pragma once
#include <cstdint>
#include <vector>

#include "model/dsv4/config.h"

namespace trex::dsv4 {

// cos/sin of every (position, pair) for positions [0, n_pos). The angle is formed as the reference
// does it, fp32(inv_freq) * fp32(pos) in fp32; cos/sin of that angle are then taken in double.
template <typename T>
struct RopeTable {
  int64_t n_pairs = 0;
  int64_t n_pos = 0;
  std::vector<T> cos, sin;  // [n_pos, n_pairs]

  const T* cos_at(int64_t pos) const { return cos.data() + pos * n_pairs; }
  const T* sin_at(int64_t pos) const { return sin.data() + pos * n_pairs; }
};

template <typename T>
RopeTable<T> make_rope_table(const std::vector<double>& inv_freq, int64_t n_pos);

// Rotates the interleaved pairs of x[0 .. 2*n_pairs) by +angle (sign = +1) or -angle (sign = -1).
// The transpose of the rotation by +angle is the rotation by -angle, so backward uses -sign.
template <typename T>
inline void rope_rotate(T* x, const T* cos, const T* sin, int64_t n_pairs, int sign) {
  for (int64_t k = 0; k < n_pairs; ++k) {
    const T c = cos[k], s = sign > 0 ? sin[k] : -sin[k];
    const T x0 = x[2 * k], x1 = x[2 * k + 1];
    x[2 * k] = x0 * c - x1 * s;
    x[2 * k + 1] = x0 * s + x1 * c;
  }
}

}  // namespace trex::dsv4
