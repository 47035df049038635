#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope.h"

namespace trex::cuda {

namespace {

__device__ inline float to_f(float v) { return v; }
__device__ inline float to_f(bf16 v) { return __bfloat162float(v); }
__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(bf16* p, float v) { *p = __float2bfloat16(v); }

template <typename T>
__global__ void rope_kernel(T* x, RopeArgs a) {
  const int64_t pairs = a.rope_dim / 2, total = a.rows * a.heads * pairs;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = i % pairs, rh = i / pairs, row = rh / a.heads;
    const int64_t p = a.pos[row];
    const float c = a.cos[p * pairs + k], s = a.sign > 0 ? a.sin[p * pairs + k] : -a.sin[p * pairs + k];
    T* v = x + rh * a.c + (a.c - a.rope_dim) + 2 * k;
    const float x0 = to_f(v[0]), x1 = to_f(v[1]);
    store(v, x0 * c - x1 * s);
    store(v + 1, x0 * s + x1 * c);
  }
}

template <typename T>
void launch(T* x, const RopeArgs& a, cudaStream_t s) {
  TREX_CHECK(a.rope_dim > 0 && a.rope_dim % 2 == 0 && a.rope_dim <= a.c, "rope (CUDA): rope_dim {} vs c {}",
             a.rope_dim, a.c);
  const int64_t total = a.rows * a.heads * (a.rope_dim / 2);
  if (total <= 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535 * 16);
  rope_kernel<T><<<unsigned(blocks), 256, 0, s>>>(x, a);
  TREX_CUDA_LAUNCHED();
}

}  // namespace

void rope_apply(bf16* x, const RopeArgs& a, cudaStream_t s) { launch(x, a, s); }
void rope_apply(float* x, const RopeArgs& a, cudaStream_t s) { launch(x, a, s); }

}  // namespace trex::cuda
