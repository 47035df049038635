#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"

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

// One block per row. Rows are re-read from L2 in the second pass (d <= 16K bf16 = 32 KB fits).
__global__ void rmsnorm_fwd_kernel(bf16* y, float* rstd, const bf16* x, const bf16* w, int64_t d, float eps) {
  __shared__ float shared[32];
  const bf16* xr = x + blockIdx.x * d;
  bf16* yr = y + blockIdx.x * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = __bfloat162float(xr[j]);
    ss += v * v;
  }
  float r = rsqrtf(block_sum(ss, shared) / float(d) + eps);
  if (threadIdx.x == 0 && rstd) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = __bfloat162float(xr[j]) * r;
    yr[j] = __float2bfloat16(w ? __bfloat162float(w[j]) * v : v);
  }
}

constexpr int kRowsPerBlock = 16;

// Block b handles rows [b*16, b*16+16): dx per row, and its partial dw sums in dw_partial[b].
__global__ void rmsnorm_bwd_kernel(bf16* dx, float* dw_partial, const bf16* dy, const bf16* x, const bf16* w,
                                   const float* rstd, int64_t n, int64_t d) {
  __shared__ float shared[32];
  const int64_t row0 = int64_t(blockIdx.x) * kRowsPerBlock;
  float* part = dw_partial ? dw_partial + int64_t(blockIdx.x) * d : nullptr;
  if (part)
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) part[j] = 0.f;
  for (int64_t i = row0; i < row0 + kRowsPerBlock && i < n; ++i) {
    const bf16* xr = x + i * d;
    const bf16* dyr = dy + i * d;
    const float r = rstd[i];
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float g = __bfloat162float(dyr[j]) * (w ? __bfloat162float(w[j]) : 1.f);
      dot += g * __bfloat162float(xr[j]);
    }
    const float c = block_sum(dot, shared) * r * r * r / float(d);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float xv = __bfloat162float(xr[j]), dyv = __bfloat162float(dyr[j]);
      float g = dyv * (w ? __bfloat162float(w[j]) : 1.f);
      dx[i * d + j] = __float2bfloat16(r * g - c * xv);
      if (part) part[j] += dyv * xv * r;  // each thread owns its columns: no race
    }
  }
}

__global__ void dw_reduce_kernel(float* dw, const float* partial, int64_t rows, int64_t d) {
  int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.f;
  for (int64_t r = 0; r < rows; ++r) acc += partial[r * d + j];
  dw[j] += acc;
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
  rmsnorm_fwd_kernel<<<unsigned(n), kThreads, 0, s>>>(y, rstd, x, w, d, eps);
  TREX_CUDA_LAUNCHED();
}

int64_t rmsnorm_dw_partial_rows(int64_t n) { return (n + kRowsPerBlock - 1) / kRowsPerBlock; }

void rmsnorm_bwd(bf16* dx, float* dw_partial, const bf16* dy, const bf16* x, const bf16* w, const float* rstd,
                 int64_t n, int64_t d, cudaStream_t s) {
  if (n == 0) return;
  rmsnorm_bwd_kernel<<<unsigned(rmsnorm_dw_partial_rows(n)), kThreads, 0, s>>>(dx, dw_partial, dy, x, w, rstd, n, d);
  TREX_CUDA_LAUNCHED();
}

void rmsnorm_dw_reduce(float* dw, const float* dw_partial, int64_t partial_rows, int64_t d, cudaStream_t s) {
  dw_reduce_kernel<<<blocks_for(d), kThreads, 0, s>>>(dw, dw_partial, partial_rows, d);
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
