#include <cmath>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

namespace {

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, __nv_bfloat16* wb, int64_t n, float b1,
                             float b2, float step_size, float inv_sqrt_bc2, float eps, float shrink) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * inv_sqrt_bc2 + eps;
    const float wi = w[i] * shrink - step_size * mi / denom;
    w[i] = wi;
    if (wb) wb[i] = __float2bfloat16(wi);
  }
}

}  // namespace

void adamw_step(float* w, const float* g, float* m, float* v, __nv_bfloat16* w_bf16, int64_t n, const AdamWStep& a,
                cudaStream_t s) {
  if (n <= 0) return;
  TREX_CHECK(a.step >= 1, "adamw_step: step {} must be >= 1", a.step);
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step)), bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 16);
  adamw_kernel<<<unsigned(blocks), 256, 0, s>>>(w, g, m, v, w_bf16, n, float(a.beta1), float(a.beta2),
                                                float(a.lr / bc1), float(1.0 / std::sqrt(bc2)), float(a.eps),
                                                float(1.0 - a.lr * a.weight_decay));
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
