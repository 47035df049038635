#include "kernels/cuda/balance.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {
namespace {

constexpr int kThreads = 256;

// S_t = sum_e s_te (fp64), one thread per token.
__global__ void token_sums_kernel(const float* scores, int64_t N, int64_t E, double* sums) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= N) return;
  double s = 0;
  for (int64_t e = 0; e < E; ++e) s += double(scores[t * E + e]);
  sums[t] = s;
}

// One thread per (row b, expert e): the count and the mean normalised score over the row's tokens, in token order.
// coef[b, e] = alpha f_e / (B T) (the gradient's constant), term[b, e] = f_e P_e.
__global__ void expert_stats_kernel(const float* scores, const int32_t* sel, const double* sums, int64_t B, int64_t T,
                                    int64_t E, int64_t K, double alpha, double* coef, double* term) {
  const int64_t b = blockIdx.y, e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  double p = 0;
  int64_t count = 0;
  for (int64_t t = b * T; t < (b + 1) * T; ++t) {
    p += double(scores[t * E + e]) / sums[t];
    for (int64_t k = 0; k < K; ++k) count += sel[t * K + k] == int32_t(e);
  }
  const double f = double(count) * double(E) / double(K * T);
  coef[b * E + e] = alpha * f / double(B * T);
  term[b * E + e] = f * (p / double(T));
}

// row_loss[b] = alpha / B * sum_e term[b, e]: one block per row, a fixed reduction tree.
__global__ void row_loss_kernel(const double* term, int64_t B, int64_t E, double alpha, double* row_loss) {
  __shared__ double red[kThreads];
  const int64_t b = blockIdx.x;
  double acc = 0;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) acc += term[b * E + e];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) row_loss[b] = alpha * red[0] / double(B);
}

// dscores_te = (coef_e - sum_e' coef_e' s_te' / S_t) / S_t, one thread per token.
__global__ void dscores_kernel(const float* scores, const double* sums, const double* coef, int64_t N, int64_t T,
                               int64_t E, float* dscores) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= N) return;
  const double* c = coef + (t / T) * E;
  const double s = sums[t];
  double dot = 0;
  for (int64_t e = 0; e < E; ++e) dot += c[e] * double(scores[t * E + e]) / s;
  for (int64_t e = 0; e < E; ++e) dscores[t * E + e] = float((c[e] - dot) / s);
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

int64_t balance_loss_scratch(int64_t B, int64_t T, int64_t E) { return B * T + 2 * B * E; }

void balance_loss(const float* scores, const int32_t* sel, int64_t B, int64_t T, int64_t E, int64_t K, double alpha,
                  double* row_loss, float* dscores, double* scratch, cudaStream_t s) {
  TREX_CHECK(B >= 1 && T >= 1 && E >= 1 && K >= 1 && K <= E, "balance_loss: bad shape B {} T {} E {} K {}", B, T, E,
             K);
  TREX_CHECK(B <= 65535, "balance_loss: {} rows (at most 65535)", B);
  const int64_t N = B * T;
  double* sums = scratch;
  double* coef = sums + N;
  double* term = coef + B * E;
  token_sums_kernel<<<blocks_for(N), kThreads, 0, s>>>(scores, N, E, sums);
  TREX_CUDA_LAUNCHED();
  expert_stats_kernel<<<dim3(blocks_for(E), unsigned(B)), kThreads, 0, s>>>(scores, sel, sums, B, T, E, K, alpha,
                                                                             coef, term);
  TREX_CUDA_LAUNCHED();
  row_loss_kernel<<<unsigned(B), kThreads, 0, s>>>(term, B, E, alpha, row_loss);
  TREX_CUDA_LAUNCHED();
  dscores_kernel<<<blocks_for(N), kThreads, 0, s>>>(scores, sums, coef, N, T, E, dscores);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
