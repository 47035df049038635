// Clamped SwiGLU (DeepSeek-V4 §2.9): h = silu(min(gate, L)) * clamp(up, -L, L); limit <= 0 disables the clamp.
// The clamp's derivative is 1 inside [.., L] (inclusive, as torch.clamp) and 0 outside.
#pragma once
#include <cmath>
#include <cstdint>

namespace trex::cpu {

template <class T>
inline T sigmoid_t(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
void swiglu_fwd(T* h, const T* gate, const T* up, int64_t n, double limit) {
  const bool clamp = limit > 0;
  const T lim = T(limit);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    T g = gate[i], u = up[i];
    if (clamp) {
      g = g > lim ? lim : g;
      u = u > lim ? lim : (u < -lim ? -lim : u);
    }
    h[i] = g * sigmoid_t(g) * u;
  }
}

// dgate, dup are written (not accumulated).
template <class T>
void swiglu_bwd(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n, double limit) {
  const bool clamp = limit > 0;
  const T lim = T(limit);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    T g = gate[i], u = up[i];
    bool g_pass = true, u_pass = true;
    if (clamp) {
      if (g > lim) g = lim, g_pass = false;
      if (u > lim) u = lim, u_pass = false;
      if (u < -lim) u = -lim, u_pass = false;
    }
    const T s = sigmoid_t(g);
    const T silu = g * s;
    const T dsilu = s * (T(1) + g * (T(1) - s));
    dgate[i] = g_pass ? dh[i] * u * dsilu : T(0);
    dup[i] = u_pass ? dh[i] * silu : T(0);
  }
}

}  // namespace trex::cpu
