#include "optim/update_rules.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/matmul.h"

namespace trex::optim {

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr, const AdamWConfig& c,
                  int64_t step, bool decay) {
  const double b1 = c.beta1, b2 = c.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(step)), bc2 = 1.0 - std::pow(b2, double(step));
  const float shrink = decay ? float(1.0 - lr * c.weight_decay) : 1.0f;
  const float fb1 = float(b1), fb2 = float(b2), step_size = float(lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float eps = float(c.eps);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    m[i] = fb1 * m[i] + (1.0f - fb1) * gi;
    v[i] = fb2 * v[i] + (1.0f - fb2) * gi * gi;
    float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
    w[i] = w[i] * shrink - step_size * m[i] / denom;
  }
}

// X is n x m with n <= m (row-major). A = X X^T, B = b A + c A A, X <- a X + B X.
static void ns_iterations(float* x, int64_t n, int64_t m, const MuonConfig& c, std::vector<float>& work) {
  work.resize(size_t(2 * n * n + n * m));
  float* a_mat = work.data();
  float* b_mat = a_mat + n * n;
  float* bx = b_mat + n * n;
  int total = c.ns_fast_steps + c.ns_final_steps;
  for (int it = 0; it < total; ++it) {
    const bool fast = it < c.ns_fast_steps;
    const float ca = fast ? 3.4445f : 2.0f, cb = fast ? -4.7750f : -1.5f, cc = fast ? 2.0315f : 0.5f;
    cpu::gemm(a_mat, x, x, n, n, m, false, true);                 // A = X X^T
    cpu::gemm(b_mat, a_mat, a_mat, n, n, n, false, false, cc);    // B = c A A
    for (int64_t i = 0; i < n * n; ++i) b_mat[i] += cb * a_mat[i];
    cpu::gemm(bx, b_mat, x, n, m, n, false, false);               // B X
    for (int64_t i = 0; i < n * m; ++i) x[i] = ca * x[i] + bx[i];
  }
}

void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonConfig& c, std::vector<float>& work) {
  const int64_t n = rows * cols;
  double norm = std::sqrt(sum_squares(x, n));
  const float inv = float(1.0 / (norm + 1e-7));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
  if (rows <= cols) {
    ns_iterations(x, rows, cols, c, work);
    return;
  }
  // Tall matrix: iterate on the transpose (cols x rows) so X X^T stays small.
  std::vector<float> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = x[i * cols + j];
  ns_iterations(t.data(), cols, rows, c, work);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) x[i * cols + j] = t[size_t(j * rows + i)];
}

void muon_update(float* w, const float* g, float* mom, int64_t rows, int64_t cols, double lr, const MuonConfig& c,
                 std::vector<float>& work) {
  const int64_t n = rows * cols;
  std::vector<float> o(static_cast<size_t>(n));
  const float mu = float(c.momentum);
  for (int64_t i = 0; i < n; ++i) {
    mom[i] = mu * mom[i] + g[i];
    o[size_t(i)] = c.nesterov ? mu * mom[i] + g[i] : mom[i];
  }
  newton_schulz(o.data(), rows, cols, c, work);
  const float scale = float(lr * std::sqrt(double(std::max(rows, cols))) * c.update_rms);
  const float shrink = float(1.0 - lr * c.weight_decay);
  for (int64_t i = 0; i < n; ++i) w[i] = w[i] * shrink - scale * o[size_t(i)];
}

double sum_squares(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t ci = 0; ci < chunks; ++ci) {
    double s = 0;
    const int64_t end = std::min(n, (ci + 1) * kChunk);
    for (int64_t i = ci * kChunk; i < end; ++i) s += double(x[i]) * double(x[i]);
    part[size_t(ci)] = s;
  }
  double total = 0;
  for (double p : part) total += p;
  return total;
}

}  // namespace trex::optim
