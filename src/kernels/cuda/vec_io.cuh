// V consecutive elements of a row between memory and fp32 registers: V = 8 as one 16-byte access for bf16 (two for
// fp32), V = 1 scalar (rows of any width or alignment). bf16 stores round to nearest even. The kernels' one vector
// load / store: the element-wise kernels (norms, RoPE, casts), the mHC and router kernels, the sparse attention.
#pragma once
#include <cuda_bf16.h>

namespace trex::cuda::vec {

// 8 bf16 values held in one 16-byte register word <-> 8 fp32 values (round to nearest even).
__device__ inline void unpack8(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x, f[2 * i + 1] = x.y;
  }
}
__device__ inline uint4 pack8(const float* f) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

template <int V>
__device__ inline void load_v(const __nv_bfloat16* p, float* f) {
  if constexpr (V == 8) {
    unpack8(*reinterpret_cast<const uint4*>(p), f);
  } else {
    f[0] = __bfloat162float(p[0]);
  }
}

template <int V>
__device__ inline void store_v(__nv_bfloat16* p, const float* f) {
  if constexpr (V == 8) {
    *reinterpret_cast<uint4*>(p) = pack8(f);
  } else {
    p[0] = __float2bfloat16(f[0]);
  }
}

template <int V>
__device__ inline void load_v(const float* p, float* f) {
  if constexpr (V == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
    f[0] = p[0];
  }
}

template <int V>
__device__ inline void store_v(float* p, const float* f) {
  if constexpr (V == 8) {
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
  } else {
    p[0] = f[0];
  }
}

}  // namespace trex::cuda::vec
