// dW[k, j] += sum_t A[t, k] X[t, j] for fp32 A [n, K] and bf16 X [n, D]: the weight gradient of a K-row
// projection of token vectors (the mHC and hc_head `fn` gradients). Memory-bound on one read of X, so the
// kernel is shaped for bandwidth: a block owns 64 columns (two per lane, one 4-byte load per token, 128 bytes
// per warp), its 8 warps split the tokens (warp w takes t = w, w + 8, ...) and their partials are summed in
// fixed warp order in shared memory. No atomics, deterministic. Grid: ceil(D / 64) x splits blocks of 256. With
// scratch (token_weight_grad_scratch floats) the tokens are also split into up to 8 ranges (blockIdx.y), each
// writing its own partial [K, D]; a second kernel adds the partials to dW in split order. That multiplies the
// loads in flight (the single-range grid is only D / 64 blocks); without scratch one range accumulates directly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

constexpr int kTokenGradWarps = 8;
constexpr int kTokenGradCols = 64;

// Token ranges for n tokens when scratch is given: one per 512 tokens, 1..8.
inline int token_weight_grad_splits(int64_t n) {
  return int(n / 512 < 1 ? 1 : (n / 512 > 8 ? 8 : n / 512));
}
// fp32 scratch elements of the split form: the partials [splits, K, D] (0 when there is one range).
inline int64_t token_weight_grad_scratch(int64_t n, int64_t K, int64_t D) {
  const int splits = token_weight_grad_splits(n);
  return splits > 1 ? int64_t(splits) * K * D : 0;
}

// Tokens [blockIdx.y * per_split, + per_split) of n. partial: WRITES partial[blockIdx.y][k][j]; null: ACCUMULATES
// dW[k][j].
template <int K>
__global__ void __launch_bounds__(kTokenGradWarps * 32)
    token_weight_grad_kernel(int64_t n, int64_t D, const __nv_bfloat16* X, const float* A, float* dW,
                             float* partial, int64_t per_split) {
  static_assert(K % 4 == 0, "token_weight_grad_kernel: K must be a multiple of 4 (float4 rows of A)");
  __shared__ float part[K][kTokenGradCols];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t j = int64_t(blockIdx.x) * kTokenGradCols + 2 * lane;
  float a0[K], a1[K];
#pragma unroll
  for (int k = 0; k < K; ++k) a0[k] = 0.f, a1[k] = 0.f;
  const int64_t t_lo = int64_t(blockIdx.y) * per_split, t_hi = t_lo + per_split < n ? t_lo + per_split : n;
  if (j < D) {  // D is even, so j + 1 < D too
#pragma unroll 4
    for (int64_t t = t_lo + w; t < t_hi; t += kTokenGradWarps) {
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(X + t * D + j));
      const float4* ar = reinterpret_cast<const float4*>(A + t * K);
#pragma unroll
      for (int q = 0; q < K / 4; ++q) {
        const float4 c = ar[q];
        a0[4 * q] = fmaf(c.x, x.x, a0[4 * q]), a1[4 * q] = fmaf(c.x, x.y, a1[4 * q]);
        a0[4 * q + 1] = fmaf(c.y, x.x, a0[4 * q + 1]), a1[4 * q + 1] = fmaf(c.y, x.y, a1[4 * q + 1]);
        a0[4 * q + 2] = fmaf(c.z, x.x, a0[4 * q + 2]), a1[4 * q + 2] = fmaf(c.z, x.y, a1[4 * q + 2]);
        a0[4 * q + 3] = fmaf(c.w, x.x, a0[4 * q + 3]), a1[4 * q + 3] = fmaf(c.w, x.y, a1[4 * q + 3]);
      }
    }
  }
  for (int r = 0; r < kTokenGradWarps; ++r) {
    if (w == r)
#pragma unroll
      for (int k = 0; k < K; ++k) {
        part[k][2 * lane] = r == 0 ? a0[k] : part[k][2 * lane] + a0[k];
        part[k][2 * lane + 1] = r == 0 ? a1[k] : part[k][2 * lane + 1] + a1[k];
      }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < K * kTokenGradCols; idx += kTokenGradWarps * 32) {
    const int k = idx / kTokenGradCols, c = idx % kTokenGradCols;
    const int64_t jj = int64_t(blockIdx.x) * kTokenGradCols + c;
    if (jj >= D) continue;
    if (partial)
      partial[(int64_t(blockIdx.y) * K + k) * D + jj] = part[k][c];
    else
      dW[k * D + jj] += part[k][c];
  }
}

// dW[i] += sum over splits s (in order) of partial[s][i], i < KD.
static __global__ void token_weight_grad_reduce_kernel(int64_t KD, int splits, const float* partial, float* dW) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= KD) return;
  float acc = 0.f;
  for (int s = 0; s < splits; ++s) acc += partial[int64_t(s) * KD + i];
  dW[i] += acc;
}

// Launches token_weight_grad_kernel<K> (+ the reduction); D must be even and X's rows 4-byte aligned, A's rows
// 16-byte aligned. scratch: token_weight_grad_scratch(n, K, D) floats, or null for the single-range form.
template <int K>
inline void token_weight_grad(int64_t n, int64_t D, const __nv_bfloat16* X, const float* A, float* dW,
                              float* scratch, cudaStream_t stream) {
  const int splits = scratch ? token_weight_grad_splits(n) : 1;
  const int64_t per_split = (n + splits - 1) / splits;
  const dim3 grid(unsigned((D + kTokenGradCols - 1) / kTokenGradCols), unsigned(splits));
  float* partial = splits > 1 ? scratch : nullptr;
  token_weight_grad_kernel<K><<<grid, kTokenGradWarps * 32, 0, stream>>>(n, D, X, A, dW, partial, per_split);
  if (partial)
    token_weight_grad_reduce_kernel<<<unsigned((K * D + 255) / 256), 256, 0, stream>>>(K * D, splits, partial, dW);
}

}  // namespace trex::cuda
