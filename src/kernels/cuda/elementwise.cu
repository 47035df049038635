#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/vec_io.cuh"
#include "kernels/cuda/block_reduce.cuh"

#include <cstdint>
#include <initializer_list>

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

using reduce::block_sum;

using vec::load_v;
using vec::store_v;

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

using reduce::warp_sum;

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

// Rows of width d <= 256 NC (d % 8 == 0): the same 16 rows per block and partial layout as above, but warp w takes
// rows row0 + w and row0 + w + 8 with the row in registers (no block-wide reduction per row; the kernel above
// leaves 3/4 of its threads idle at d = 512), its dw terms summed in registers, then the 8 warps' sums added in
// warp order through shared memory [8][d] (deterministic).
template <int NC>
__global__ void __launch_bounds__(kThreads) rmsnorm_bwd_warp_kernel(bf16* dx, float* dw_partial, const bf16* dy,
                                                                    const bf16* x, const bf16* w,
                                                                    const float* rstd, int64_t n, int64_t d) {
  extern __shared__ float wpart[];  // [kThreads / 32][d] when dw_partial
  static_assert(kRowsPerBlock == 2 * (kThreads / 32), "two rows per warp");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerBlock;
  float acc[NC][8];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[c][e] = 0.f;
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t i = row0 + warp + rr * (kThreads / 32);
    if (i >= n) break;  // warp-uniform
    const float r = rstd[i];
    float xv[NC][8], g[NC][8];
    float dot = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int64_t j = (c * 32 + lane) * 8;
      if (j >= d) continue;
      float wv[8];
      load_v<8>(x + i * d + j, xv[c]);
      load_v<8>(dy + i * d + j, g[c]);
      if (w) load_v<8>(w + j, wv);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (dw_partial) acc[c][e] += g[c][e] * xv[c][e] * r;
        g[c][e] *= w ? wv[e] : 1.f;
        dot += g[c][e] * xv[c][e];
      }
    }
    const float k = warp_sum(dot) * r * r * r / float(d);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int64_t j = (c * 32 + lane) * 8;
      if (j >= d) continue;
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = r * g[c][e] - k * xv[c][e];
      store_v<8>(dx + i * d + j, o);
    }
  }
  if (!dw_partial) return;  // block-uniform
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int64_t j = (c * 32 + lane) * 8;
    if (j < d) store_v<8>(wpart + warp * d + j, acc[c]);
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    float t = 0.f;
#pragma unroll
    for (int u = 0; u < kThreads / 32; ++u) t += wpart[u * d + j];
    dw_partial[int64_t(blockIdx.x) * d + j] = t;
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

// ---- RMSNorm fused with RoPE (per-head norms of the attention) ----

__device__ inline float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }
__device__ inline void rope_cs(const RopeArgs& a, int64_t p, int k, float& cs, float& sn) {
  const int64_t i = p * (a.rope_dim / 2) + k;
  cs = a.cos[i], sn = a.sign > 0 ? a.sin[i] : -a.sin[i];
}
// Rotates the pairs among the 8 values at columns [j, j + 8) of a head (j % 8 == 0, base = c - rope_dim even, so
// a pair never straddles two chunks).
__device__ inline void rope8(float* v, int j, int base, int64_t p, const RopeArgs& a) {
  if (j + 8 <= base) return;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (j + 2 * q < base) continue;
    float cs, sn;
    rope_cs(a, p, (j + 2 * q - base) / 2, cs, sn);
    const float x0 = v[2 * q], x1 = v[2 * q + 1];
    v[2 * q] = x0 * cs - x1 * sn;
    v[2 * q + 1] = x0 * sn + x1 * cs;
  }
}

// Warp per row; NC chunks of 8 columns per lane held in registers (c <= 256 NC).
template <int NC>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_rope_fwd_kernel(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t n, float eps, RopeArgs a) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= n) return;  // whole warps
  const int lane = threadIdx.x % 32, d = int(a.c), base = d - int(a.rope_dim);
  const bf16* xr = x + row * d;
  float v[NC][8];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int j = (c * 32 + lane) * 8;
    if (j < d) {
      load_v<8>(xr + j, v[c]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[c][e] * v[c][e];
    }
  }
  const float r = rsqrtf(warp_sum(ss) / float(d) + eps);
  if (lane == 0 && rstd) rstd[row] = r;
  const int64_t p = a.pos[row / a.heads];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int j = (c * 32 + lane) * 8;
    if (j >= d) continue;
    float wv[8];
    if (w) load_v<8>(w + j, wv);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[c][e] = round_bf16(w ? wv[e] * (v[c][e] * r) : v[c][e] * r);
    rope8(v[c], j, base, p, a);
    store_v<8>(y + row * d + j, v[c]);
  }
}

// Any widths: warp per row, one column per lane step; a rotated column reads its pair partner.
__global__ void __launch_bounds__(kThreads) rmsnorm_rope_fwd_generic_kernel(bf16* y, float* rstd, const bf16* x,
                                                                            const bf16* w, int64_t n, float eps,
                                                                            RopeArgs a) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= n) return;
  const int lane = threadIdx.x % 32, d = int(a.c), base = d - int(a.rope_dim);
  const bf16* xr = x + row * d;
  float ss = 0.f;
  for (int j = lane; j < d; j += 32) {
    const float v = __bfloat162float(xr[j]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / float(d) + eps);
  if (lane == 0 && rstd) rstd[row] = r;
  const int64_t p = a.pos[row / a.heads];
  auto normed = [&](int j) {
    const float v = __bfloat162float(xr[j]);
    return round_bf16(w ? __bfloat162float(w[j]) * (v * r) : v * r);
  };
  for (int j = lane; j < d; j += 32) {
    float o = normed(j);
    if (j >= base) {
      const bool odd = ((j - base) & 1) != 0;
      const float x0 = odd ? normed(j - 1) : o, x1 = odd ? o : normed(j + 1);
      float cs, sn;
      rope_cs(a, p, (j - base) / 2, cs, sn);
      o = odd ? x0 * sn + x1 * cs : x0 * cs - x1 * sn;
    }
    y[row * d + j] = __float2bfloat16(o);
  }
}

template <int NC>
__global__ void __launch_bounds__(kThreads)
    rope_rmsnorm_bwd_kernel(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, int64_t n, RopeArgs a) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= n) return;
  const int lane = threadIdx.x % 32, d = int(a.c), base = d - int(a.rope_dim);
  const int64_t p = a.pos[row / a.heads];
  float g[NC][8], xv[NC][8];
  float dot = 0.f;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int j = (c * 32 + lane) * 8;
    if (j >= d) continue;
    load_v<8>(dy + row * d + j, g[c]);
    if (j + 8 > base) {
      rope8(g[c], j, base, p, a);
#pragma unroll
      for (int e = 0; e < 8; ++e) g[c][e] = round_bf16(g[c][e]);
    }
    load_v<8>(x + row * d + j, xv[c]);
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += g[c][e] * xv[c][e];
  }
  const float r = rstd[row];
  const float k = warp_sum(dot) * r * r * r / float(d);
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const int j = (c * 32 + lane) * 8;
    if (j >= d) continue;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = r * g[c][e] - k * xv[c][e];
    store_v<8>(dx + row * d + j, o);
  }
}

__global__ void __launch_bounds__(kThreads) rope_rmsnorm_bwd_generic_kernel(bf16* dx, const bf16* dy, const bf16* x,
                                                                            const float* rstd, int64_t n,
                                                                            RopeArgs a) {
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= n) return;
  const int lane = threadIdx.x % 32, d = int(a.c), base = d - int(a.rope_dim);
  const int64_t p = a.pos[row / a.heads];
  const bf16* dyr = dy + row * d;
  const bf16* xr = x + row * d;
  auto grad = [&](int j) {  // the rotated gradient at column j
    if (j < base) return __bfloat162float(dyr[j]);
    const bool odd = ((j - base) & 1) != 0;
    const int j0 = odd ? j - 1 : j;
    const float x0 = __bfloat162float(dyr[j0]), x1 = __bfloat162float(dyr[j0 + 1]);
    float cs, sn;
    rope_cs(a, p, (j - base) / 2, cs, sn);
    return round_bf16(odd ? x0 * sn + x1 * cs : x0 * cs - x1 * sn);
  };
  float dot = 0.f;
  for (int j = lane; j < d; j += 32) dot += grad(j) * __bfloat162float(xr[j]);
  const float r = rstd[row];
  const float k = warp_sum(dot) * r * r * r / float(d);
  for (int j = lane; j < d; j += 32) dx[row * d + j] = __float2bfloat16(r * grad(j) - k * __bfloat162float(xr[j]));
}

// Registers per lane for a row of width d: 1, 2 or 4 chunks of 8; 0 = the generic kernel.
int rope_norm_chunks(int64_t d, std::initializer_list<const void*> ptrs) {
  if (!vec8_ok(d, ptrs)) return 0;
  return d <= 256 ? 1 : d <= 512 ? 2 : d <= 1024 ? 4 : 0;
}

void check_rope_norm(const RopeArgs& a, const char* what) {
  TREX_CHECK(a.rope_dim > 0 && a.rope_dim % 2 == 0 && a.rope_dim <= a.c, "{}: rope_dim {} vs head width {}", what,
             a.rope_dim, a.c);
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
  const size_t smem = dw_partial ? size_t(kThreads / 32) * size_t(d) * sizeof(float) : 0;
  if (vec8_ok(d, {dx, dw_partial, dy, x, w}) && d <= 1024) {
    if (d <= 256)
      rmsnorm_bwd_warp_kernel<1><<<blocks, kThreads, smem, s>>>(dx, dw_partial, dy, x, w, rstd, n, d);
    else if (d <= 512)
      rmsnorm_bwd_warp_kernel<2><<<blocks, kThreads, smem, s>>>(dx, dw_partial, dy, x, w, rstd, n, d);
    else
      rmsnorm_bwd_warp_kernel<4><<<blocks, kThreads, smem, s>>>(dx, dw_partial, dy, x, w, rstd, n, d);
  } else if (vec8_ok(d, {dx, dw_partial, dy, x, w}))
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

void rmsnorm_rope_fwd(bf16* y, float* rstd, const bf16* x, const bf16* w, float eps, const RopeArgs& a,
                      cudaStream_t s) {
  check_rope_norm(a, "rmsnorm_rope_fwd");
  const int64_t n = a.rows * a.heads;
  if (n == 0) return;
  const unsigned blocks = unsigned((n + kThreads / 32 - 1) / (kThreads / 32));
  switch (rope_norm_chunks(a.c, {y, x, w})) {
    case 1: rmsnorm_rope_fwd_kernel<1><<<blocks, kThreads, 0, s>>>(y, rstd, x, w, n, eps, a); break;
    case 2: rmsnorm_rope_fwd_kernel<2><<<blocks, kThreads, 0, s>>>(y, rstd, x, w, n, eps, a); break;
    case 4: rmsnorm_rope_fwd_kernel<4><<<blocks, kThreads, 0, s>>>(y, rstd, x, w, n, eps, a); break;
    default: rmsnorm_rope_fwd_generic_kernel<<<blocks, kThreads, 0, s>>>(y, rstd, x, w, n, eps, a);
  }
  TREX_CUDA_LAUNCHED();
}

void rope_rmsnorm_bwd(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, const RopeArgs& a,
                      cudaStream_t s) {
  check_rope_norm(a, "rope_rmsnorm_bwd");
  const int64_t n = a.rows * a.heads;
  if (n == 0) return;
  const unsigned blocks = unsigned((n + kThreads / 32 - 1) / (kThreads / 32));
  switch (rope_norm_chunks(a.c, {dx, dy, x})) {
    case 1: rope_rmsnorm_bwd_kernel<1><<<blocks, kThreads, 0, s>>>(dx, dy, x, rstd, n, a); break;
    case 2: rope_rmsnorm_bwd_kernel<2><<<blocks, kThreads, 0, s>>>(dx, dy, x, rstd, n, a); break;
    case 4: rope_rmsnorm_bwd_kernel<4><<<blocks, kThreads, 0, s>>>(dx, dy, x, rstd, n, a); break;
    default: rope_rmsnorm_bwd_generic_kernel<<<blocks, kThreads, 0, s>>>(dx, dy, x, rstd, n, a);
  }
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
