// Collapse + RMSNorm with the collapse in fp32 (see mhc_norm.h). The forward is one block per token (the fp32
// collapse staged in shared memory between the sum of squares and the scaling); the backward one block per 16
// tokens (each thread owns the same columns on every row, so the norm-weight partials need no synchronisation),
// recomputing the collapse with the forward's exact operation order.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/mhc_norm.h"
#include "kernels/cuda/vec_io.cuh"
#include "kernels/cuda/block_reduce.cuh"

#include <initializer_list>

namespace trex::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxStreams = 4;
constexpr int kRowsPerBlock = 16;
constexpr int64_t kMaxWidth = 12288;  // d fp32 values of shared memory within the default 48 KB

using reduce::block_sum;  // fixed order

// v[0..K) summed over the block (fixed order); every thread gets the totals.
template <int K>
__device__ inline void block_sums(float* v, float (*shared)[kThreads / 32]) {
  reduce::block_sums<K>(v, &shared[0][0], kThreads / 32);
}

using vec::load_v;
using vec::store_v;

// c[e] = sum_i p[i] X[i][j + e] in stream order: the one definition both passes use (bitwise equal results).
template <int V>
__device__ inline void collapse(const bf16* x, int n, int64_t d, int64_t j, const float* p, float* c) {
#pragma unroll
  for (int e = 0; e < V; ++e) c[e] = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxStreams; ++i) {
    if (i >= n) break;
    float f[V];
    load_v<V>(x + i * d + j, f);
#pragma unroll
    for (int e = 0; e < V; ++e) c[e] = fmaf(p[i], f[e], c[e]);
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads)
    collapse_norm_fwd_kernel(int n, const bf16* X, const float* p, const bf16* w, int64_t d, float eps,
                             bf16* normed, float* rstd) {
  extern __shared__ float col[];  // [d]
  __shared__ float red[kThreads / 32];
  const int64_t t = blockIdx.x;
  const bf16* x = X + t * n * d;
  float pv[kMaxStreams];
#pragma unroll
  for (int i = 0; i < kMaxStreams; ++i) pv[i] = i < n ? p[t * n + i] : 0.f;
  float ss = 0.f;
  for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
    float c[V];
    collapse<V>(x, n, d, j, pv, c);
#pragma unroll
    for (int e = 0; e < V; ++e) ss = fmaf(c[e], c[e], ss), col[j + e] = c[e];
  }
  const float r = rsqrtf(block_sum(ss, red) / float(d) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {  // own entries of col
    float wv[V], o[V];
    load_v<V>(w + j, wv);
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = wv[e] * (col[j + e] * r);
    store_v<V>(normed + t * d + j, o);
  }
}

template <int V>
__global__ void __launch_bounds__(kThreads)
    collapse_norm_bwd_kernel(int n, const bf16* X, const float* p, const bf16* w, const float* rstd,
                             const float* dy, int64_t N, int64_t d, float* dc, float* dw_partial, float* dp) {
  extern __shared__ float col[];  // [d], this row's collapse
  __shared__ float red[kThreads / 32];
  __shared__ float red4[kMaxStreams][kThreads / 32];
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerBlock;
  float* part = dw_partial ? dw_partial + int64_t(blockIdx.x) * d : nullptr;
  if (part)
    for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
      const float z[V] = {};
      store_v<V>(part + j, z);
    }
  for (int64_t t = row0; t < row0 + kRowsPerBlock && t < N; ++t) {
    const bf16* x = X + t * n * d;
    const float* g = dy + t * d;
    const float r = rstd[t];
    float pv[kMaxStreams];
#pragma unroll
    for (int i = 0; i < kMaxStreams; ++i) pv[i] = i < n ? p[t * n + i] : 0.f;
    float dot = 0.f;
    for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
      float c[V], gv[V], wv[V];
      collapse<V>(x, n, d, j, pv, c);
      load_v<V>(g + j, gv);
      load_v<V>(w + j, wv);
#pragma unroll
      for (int e = 0; e < V; ++e) dot = fmaf(gv[e] * wv[e], c[e], dot), col[j + e] = c[e];
    }
    const float k = block_sum(dot, red) * r * r * r / float(d);
    float gate[kMaxStreams] = {0.f, 0.f, 0.f, 0.f};  // dc . X[i]: the gate gradients, while dc is at hand
    for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
      float gv[V], wv[V], o[V];
      load_v<V>(g + j, gv);
      load_v<V>(w + j, wv);
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = r * (gv[e] * wv[e]) - k * col[j + e];
      store_v<V>(dc + t * d + j, o);
      if (dp)
#pragma unroll
        for (int i = 0; i < kMaxStreams; ++i) {
          if (i >= n) break;
          float f[V];
          load_v<V>(x + i * d + j, f);  // the row was read by the first pass: from cache
#pragma unroll
          for (int e = 0; e < V; ++e) gate[i] = fmaf(o[e], f[e], gate[i]);
        }
      if (part) {  // each thread owns its columns on every row: no race
        float pp[V];
        load_v<V>(part + j, pp);
#pragma unroll
        for (int e = 0; e < V; ++e) pp[e] = fmaf(gv[e] * col[j + e], r, pp[e]);
        store_v<V>(part + j, pp);
      }
    }
    if (dp) {  // block-uniform
      block_sums<kMaxStreams>(gate, red4);
      if (threadIdx.x < n) {
        float v = gate[0];
#pragma unroll
        for (int i = 1; i < kMaxStreams; ++i)
          if (int(threadIdx.x) == i) v = gate[i];
        dp[t * n + threadIdx.x] = v;
      }
    }
  }
}

bool vec8(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 8 != 0) return false;
  for (const void* q : ptrs)
    if (q && reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  return true;
}

void check(const char* what, int64_t n_hc, int64_t N, int64_t d) {
  TREX_CHECK(n_hc >= 1 && n_hc <= kMaxStreams, "{} (CUDA): {} streams, served 1..{}", what, n_hc, kMaxStreams);
  TREX_CHECK(N >= 0 && d > 0 && d <= kMaxWidth, "{} (CUDA): N {} d {} (d must be in 1..{})", what, N, d,
             kMaxWidth);
}

}  // namespace

void mhc_collapse_norm_fwd(int64_t n_hc, const bf16* X, const float* p, const bf16* w, int64_t N, int64_t d,
                           float eps, bf16* normed, float* rstd, cudaStream_t stream) {
  check("mhc_collapse_norm_fwd", n_hc, N, d);
  if (N == 0) return;
  const size_t smem = size_t(d) * sizeof(float);
  if (vec8(d, {X, w, normed}))
    collapse_norm_fwd_kernel<8><<<unsigned(N), kThreads, smem, stream>>>(int(n_hc), X, p, w, d, eps, normed, rstd);
  else
    collapse_norm_fwd_kernel<1><<<unsigned(N), kThreads, smem, stream>>>(int(n_hc), X, p, w, d, eps, normed, rstd);
  TREX_CUDA_LAUNCHED();
}

int64_t mhc_collapse_norm_dw_rows(int64_t N) {
  return (N + kRowsPerBlock - 1) / kRowsPerBlock;
}

void mhc_collapse_norm_bwd(int64_t n_hc, const bf16* X, const float* p, const bf16* w, const float* rstd,
                           const float* dy, int64_t N, int64_t d, float* dc, float* dw, float* dw_partial,
                           float* dp, cudaStream_t stream) {
  check("mhc_collapse_norm_bwd", n_hc, N, d);
  TREX_CHECK((dw == nullptr) == (dw_partial == nullptr),
             "mhc_collapse_norm_bwd (CUDA): dw and dw_partial must be given together");
  if (N == 0) return;
  const size_t smem = size_t(d) * sizeof(float);
  const unsigned blocks = unsigned(mhc_collapse_norm_dw_rows(N));
  if (vec8(d, {X, w, dy, dc, dw_partial}))
    collapse_norm_bwd_kernel<8><<<blocks, kThreads, smem, stream>>>(int(n_hc), X, p, w, rstd, dy, N, d, dc,
                                                                     dw_partial, dp);
  else
    collapse_norm_bwd_kernel<1><<<blocks, kThreads, smem, stream>>>(int(n_hc), X, p, w, rstd, dy, N, d, dc,
                                                                     dw_partial, dp);
  TREX_CUDA_LAUNCHED();
  if (dw) rmsnorm_dw_reduce(dw, dw_partial, mhc_collapse_norm_dw_rows(N), d, stream);
}

}  // namespace trex::cuda
