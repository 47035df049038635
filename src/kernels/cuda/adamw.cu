#include <cmath>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

namespace {

__device__ inline float adamw_one(float& w, float g, float& m, float& v, float b1, float b2, float step_size,
                                  float inv_sqrt_bc2, float eps, float shrink) {
  m = b1 * m + (1.f - b1) * g;
  v = b2 * v + (1.f - b2) * g * g;
  const float denom = sqrtf(v) * inv_sqrt_bc2 + eps;
  w = w * shrink - step_size * m / denom;
  return w;
}

// Four elements per thread and iteration through 16-byte loads: the update is pure streaming (30 bytes per
// parameter), so what matters is keeping enough bytes in flight per thread. vec = false (arrays not 16-byte
// aligned, e.g. a ZeRO shard at an odd offset) runs everything through the scalar tail loop.
__global__ void adamw_kernel(float* w, float* g, float* m, float* v, __nv_bfloat16* wb, int64_t n, bool vec,
                             bool zero_grad, float gs, float b1, float b2, float step_size, float inv_sqrt_bc2, float eps,
                             float shrink) {
  const int64_t n4 = vec ? n / 4 : 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += stride) {
    float4 wi = reinterpret_cast<const float4*>(w)[i];
    float4 gi = reinterpret_cast<const float4*>(g)[i];
    gi.x = __fmul_rn(gi.x, gs), gi.y = __fmul_rn(gi.y, gs), gi.z = __fmul_rn(gi.z, gs), gi.w = __fmul_rn(gi.w, gs);
    float4 mi = reinterpret_cast<const float4*>(m)[i];
    float4 vi = reinterpret_cast<const float4*>(v)[i];
    adamw_one(wi.x, gi.x, mi.x, vi.x, b1, b2, step_size, inv_sqrt_bc2, eps, shrink);
    adamw_one(wi.y, gi.y, mi.y, vi.y, b1, b2, step_size, inv_sqrt_bc2, eps, shrink);
    adamw_one(wi.z, gi.z, mi.z, vi.z, b1, b2, step_size, inv_sqrt_bc2, eps, shrink);
    adamw_one(wi.w, gi.w, mi.w, vi.w, b1, b2, step_size, inv_sqrt_bc2, eps, shrink);
    reinterpret_cast<float4*>(w)[i] = wi;
    reinterpret_cast<float4*>(m)[i] = mi;
    reinterpret_cast<float4*>(v)[i] = vi;
    if (zero_grad) reinterpret_cast<float4*>(g)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (wb) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(wi.x, wi.y), hi = __floats2bfloat162_rn(wi.z, wi.w);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      reinterpret_cast<uint2*>(wb)[i] = packed;
    }
  }
  for (int64_t i = n4 * 4 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    float wi = w[i], mi = m[i], vi = v[i];
    adamw_one(wi, __fmul_rn(g[i], gs), mi, vi, b1, b2, step_size, inv_sqrt_bc2, eps, shrink);
    w[i] = wi, m[i] = mi, v[i] = vi;
    if (zero_grad) g[i] = 0.f;
    if (wb) wb[i] = __float2bfloat16(wi);
  }
}

}  // namespace

void adamw_step(float* w, float* g, float* m, float* v, __nv_bfloat16* w_bf16, int64_t n, const AdamWStep& a,
                cudaStream_t s) {
  if (n <= 0) return;
  TREX_CHECK(a.step >= 1, "adamw_step: step {} must be >= 1", a.step);
  const double bc1 = 1.0 - std::pow(a.beta1, double(a.step)), bc2 = 1.0 - std::pow(a.beta2, double(a.step));
  auto aligned = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  const bool vec =
      aligned(w, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) && (!w_bf16 || aligned(w_bf16, 8));
  const int64_t blocks = std::min<int64_t>((n / 4 + 255) / 256 + 1, 132 * 8);
  adamw_kernel<<<unsigned(blocks), 256, 0, s>>>(w, g, m, v, w_bf16, n, vec, a.zero_grad, a.grad_scale, float(a.beta1),
                                                float(a.beta2),
                                                float(a.lr / bc1), float(1.0 / std::sqrt(bc2)), float(a.eps),
                                                float(1.0 - a.lr * a.weight_decay));
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
