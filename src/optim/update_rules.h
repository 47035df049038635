// The per-tensor update rules on raw fp32 pointers: AdamW, Muon (with the hybrid Newton-Schulz
// orthogonalisation of design §5), global-norm clipping. Optimizer (optimizer.h) applies them to a
// parameter table.
#pragma once
#include <cstdint>
#include <vector>

namespace trex::optim {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-20;          // design §5; tiny models usually want 1e-8
  double weight_decay = 0.1;   // decoupled: w <- w * (1 - lr * wd)
  bool decay_vectors = true;   // false: no weight decay on tensors with fewer than 2 dims (norms, biases)
};

struct MuonConfig {
  double momentum = 0.95;
  bool nesterov = true;
  int ns_fast_steps = 8;       // (a, b, c) = (3.4445, -4.7750, 2.0315)
  int ns_final_steps = 2;      // (a, b, c) = (2, -1.5, 0.5): pins singular values at 1
  double update_rms = 0.18;    // O <- O * sqrt(max(n, m)) * update_rms
  double weight_decay = 0.1;
};

// One AdamW step, `step` counts from 1 (bias correction).
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr, const AdamWConfig& c,
                  int64_t step, bool decay);

// In place: X <- NS(X / ||X||_F) for one rows x cols matrix. Works on the short side (transposes when
// rows > cols); `work` is resized as needed.
void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonConfig& c, std::vector<float>& work);

// One Muon step for one matrix: momentum M <- mu M + G; input = Nesterov ? mu M + G : M;
// O = NS(input) * sqrt(max(rows, cols)) * update_rms; W <- W (1 - lr wd) - lr O.
void muon_update(float* w, const float* g, float* momentum, int64_t rows, int64_t cols, double lr,
                 const MuonConfig& c, std::vector<float>& work);

// Sum of squares of n floats in double, in fixed-size chunks summed in a fixed order, so the result
// does not depend on the thread count.
double sum_squares(const float* x, int64_t n);

}  // namespace trex::optim
