// Reductions over a thread block, the kernels' one copy: warp butterflies, then the warp totals added in warp
// order, so a sum does not depend on scheduling (the same inputs give the same bits on every run).
#pragma once
#include <cuda_runtime.h>

namespace trex::cuda::reduce {

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum of v over the block (blockDim.x a multiple of 32), returned to every thread. shared: blockDim.x / 32 floats;
// free again when the call returns (it ends with a barrier), so consecutive calls may share it.
__device__ inline float block_sum(float v, float* shared) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int u = 0; u < int(blockDim.x / 32); ++u) total += shared[u];
  __syncthreads();
  return total;
}

// v[0..K) each summed over the block as block_sum sums (warp butterflies, then the warp totals added in warp order
// from 0), returned to every thread. shared: K rows of `stride` >= blockDim.x / 32 floats (row k at k * stride);
// free again when the call returns.
template <int K>
__device__ inline void block_sums(float* v, float* shared, int stride) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = warp_sum(v[k]);
    if (lane == 0) shared[k * stride + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float t = 0.f;
    for (int u = 0; u < int(blockDim.x / 32); ++u) t += shared[k * stride + u];
    v[k] = t;
  }
  __syncthreads();
}

}  // namespace trex::cuda::reduce
