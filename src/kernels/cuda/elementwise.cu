#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"

#include <cstdint>
#include <initializer_list>

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x < 32) {
    total = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (threadIdx.x == 0) shared[0] = total;
  }
  __syncthreads();
  total = shared[0];
  __syncthreads();
  return total;
}

// V consecutive elements: V = 8 as one 16-byte bf16 load (two for fp32), V = 1 scalar (rows of any width).
template <int V>
__device__ inline void load_v(const bf16* p, float* f) {
  if constexpr (V == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(h[i]);
      f[2 * i] = x.x, f[2 * i + 1] = x.y;
    }
  } else {
    f[0] = __bfloat162float(p[0]);
  }
}
template <int V>
__device__ inline void store_v(bf16* p, const float* f) {
  if constexpr (V == 8) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = u;
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

// Rows are moved V elements per access: V = 8 when d % 8 == 0 and the pointers are 16-byte aligned.
bool vec8_ok(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// One block per row. Rows are re-read from L2 in the second pass (d <= 16K bf16 = 32 KB fits).
template <int V>
__global__ void rmsnorm_fwd_kernel(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t d, float eps) {
  __shared__ float shared[32];
  const bf16* xr = x + blockIdx.x * d;
  bf16* yr = y + blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
    float v[V];
    load_v<V>(xr + j, v);
#pragma unroll
    for (int e = 0; e < V; ++e) ss += v[e] * v[e];
  }
  float r = rsqrtf(block_sum(ss, shared) / float(d) + eps);
  if (threadIdx.x == 0 && rstd) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
    float v[V], wv[V];
    load_v<V>(xr + j, v);
    if (w) load_v<V>(w + j, wv);
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = w ? wv[e] * (v[e] * r) : v[e] * r;
    store_v<V>(yr + j, v);
  }
}

constexpr int kRowsPerBlock = 16;

// Block b handles rows [b*16, b*16+16): dx per row, and its partial dw sums in dw_partial[b].
template <int V>
__global__ void rmsnorm_bwd_kernel(bf16* dx, float* dw_partial, const bf16* dy, const bf16* x, const bf16* w,
                                   const float* rstd, int64_t n, int64_t d) {
  __shared__ float shared[32];
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerBlock;
  float* part = dw_partial ? dw_partial + int64_t(blockIdx.x) * d : nullptr;
  if (part)
    for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
      const float z[V] = {};
      store_v<V>(part + j, z);
    }
  for (int64_t i = row0; i < row0 + kRowsPerBlock && i < n; ++i) {
    const bf16* xr = x + i * d;
    const bf16* dyr = dy + i * d;
    const float r = rstd[i];
    float dot = 0.f;
    for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
      float xv[V], g[V], wv[V];
      load_v<V>(xr + j, xv);
      load_v<V>(dyr + j, g);
      if (w) load_v<V>(w + j, wv);
#pragma unroll
      for (int e = 0; e < V; ++e) dot += g[e] * (w ? wv[e] : 1.f) * xv[e];
    }
    const float c = block_sum(dot, shared) * r * r * r / float(d);
    for (int64_t j = threadIdx.x * V; j < d; j += blockDim.x * V) {
      float xv[V], dyv[V], wv[V], o[V];
      load_v<V>(xr + j, xv);
      load_v<V>(dyr + j, dyv);
      if (w) load_v<V>(w + j, wv);
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = r * (dyv[e] * (w ? wv[e] : 1.f)) - c * xv[e];
      store_v<V>(dx + i * d + j, o);
      if (part) {  // each thread owns its columns (the same j every row): no race
        float pv[V];
        load_v<V>(part + j, pv);
#pragma unroll
        for (int e = 0; e < V; ++e) pv[e] += dyv[e] * xv[e] * r;
        store_v<V>(part + j, pv);
      }
    }
  }
}

constexpr int kReduceCols = 32;

// dw[j] += sum_r partial[r][j]: a block owns 32 columns, its 8 warps take rows r = w, w + 8, ... (coalesced
// 128-byte loads, enough of them in flight to stream the partials), summed in fixed warp order (deterministic).
__global__ void __launch_bounds__(kThreads) dw_reduce_kernel(float* dw, const float* partial, int64_t rows, int64_t d) {
  __shared__ float part[kThreads / 32][kReduceCols];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t j = int64_t(blockIdx.x) * kReduceCols + lane;
  float acc = 0.f;
  if (j < d)
#pragma unroll 4
    for (int64_t r = w; r < rows; r += kThreads / 32) acc += partial[r * d + j];
  part[w][lane] = acc;
  __syncthreads();
  if (w == 0 && j < d) {
    float total = 0.f;
    for (int u = 0; u < kThreads / 32; ++u) total += part[u][lane];
    dw[j] += total;
  }
}

__device__ inline float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

__global__ void swiglu_fwd_kernel(bf16* h, const bf16* gu, int64_t n, int64_t f, float limit) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * f) return;
  int64_t row = idx / f, col = idx % f;
  float g = __bfloat162float(gu[row * 2 * f + col]), u = __bfloat162float(gu[row * 2 * f + f + col]);
  if (limit > 0.f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  h[idx] = __float2bfloat16(g * sigmoidf(g) * u);
}

__global__ void swiglu_bwd_kernel(bf16* dgu, const bf16* dh, const bf16* gu, int64_t n, int64_t f, float limit) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * f) return;
  int64_t row = idx / f, col = idx % f;
  float g = __bfloat162float(gu[row * 2 * f + col]), u = __bfloat162float(gu[row * 2 * f + f + col]);
  bool g_pass = true, u_pass = true;
  if (limit > 0.f) {
    if (g > limit) g = limit, g_pass = false;
    if (u > limit) u = limit, u_pass = false;
    if (u < -limit) u = -limit, u_pass = false;
  }
  float s = sigmoidf(g), d = __bfloat162float(dh[idx]);
  dgu[row * 2 * f + col] = __float2bfloat16(g_pass ? d * u * s * (1.f + g * (1.f - s)) : 0.f);
  dgu[row * 2 * f + f + col] = __float2bfloat16(u_pass ? d * g * s : 0.f);
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void rmsnorm_fwd(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t n, int64_t d, float eps,
                 cudaStream_t s) {
  if (n == 0) return;
  if (vec8_ok(d, {y, x, w}))
    rmsnorm_fwd_kernel<8><<<unsigned(n), kThreads, 0, s>>>(y, rstd, x, w, d, eps);
  else
    rmsnorm_fwd_kernel<1><<<unsigned(n), kThreads, 0, s>>>(y, rstd, x, w, d, eps);
  TREX_CUDA_LAUNCHED();
}

int64_t rmsnorm_dw_partial_rows(int64_t n) { return (n + kRowsPerBlock - 1) / kRowsPerBlock; }

void rmsnorm_bwd(bf16* dx, float* dw_partial, const bf16* dy, const bf16* x, const bf16* w, const float* rstd,
                 int64_t n, int64_t d, cudaStream_t s) {
  if (n == 0) return;
  const unsigned blocks = unsigned(rmsnorm_dw_partial_rows(n));
  if (vec8_ok(d, {dx, dw_partial, dy, x, w}))
    rmsnorm_bwd_kernel<8><<<blocks, kThreads, 0, s>>>(dx, dw_partial, dy, x, w, rstd, n, d);
  else
    rmsnorm_bwd_kernel<1><<<blocks, kThreads, 0, s>>>(dx, dw_partial, dy, x, w, rstd, n, d);
  TREX_CUDA_LAUNCHED();
}

void rmsnorm_dw_reduce(float* dw, const float* dw_partial, int64_t partial_rows, int64_t d, cudaStream_t s) {
  if (d == 0) return;
  dw_reduce_kernel<<<unsigned((d + kReduceCols - 1) / kReduceCols), kThreads, 0, s>>>(dw, dw_partial, partial_rows, d);
  TREX_CUDA_LAUNCHED();
}

void swiglu_fwd(bf16* h, const bf16* gate_up, int64_t n, int64_t f, float limit, cudaStream_t s) {
  if (n * f == 0) return;
  swiglu_fwd_kernel<<<blocks_for(n * f), kThreads, 0, s>>>(h, gate_up, n, f, limit);
  TREX_CUDA_LAUNCHED();
}

void swiglu_bwd(bf16* d_gate_up, const bf16* dh, const bf16* gate_up, int64_t n, int64_t f, float limit,
                cudaStream_t s) {
  if (n * f == 0) return;
  swiglu_bwd_kernel<<<blocks_for(n * f), kThreads, 0, s>>>(d_gate_up, dh, gate_up, n, f, limit);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
