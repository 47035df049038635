#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/random_fill.h"

namespace trex::cuda {
namespace {

__device__ inline float uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.f / 16777216.f) * 2.f - 1.f;
}

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = T(scale * uniform(seed, uint64_t(i)));
}

}  // namespace

void fill_uniform_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<1024, 256, 0, s>>>(x, n, seed, scale);
  TREX_CUDA_LAUNCHED();
}

void fill_uniform_f32(float* x, int64_t n, uint64_t seed, float scale, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<1024, 256, 0, s>>>(x, n, seed, scale);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
