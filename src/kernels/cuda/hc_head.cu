#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hc_head.h"
#include "kernels/cuda/token_weight_grad.cuh"

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

// Sums v[0..K) over the block; every thread gets the totals.
template <int K>
__device__ void block_sums(float* v, float* shared /* [K][32] */) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    if (lane == 0) shared[k * 32 + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float t = 0.f;
    for (int i = 0; i < nw; ++i) t += shared[k * 32 + i];
    v[k] = t;
  }
  __syncthreads();
}

__device__ inline float sigm(float x) { return 1.f / (1.f + __expf(-x)); }

__global__ void hc_head_fwd_kernel(bf16* y, float* mix, float* rstd, float* w, const bf16* X, const float* fn,
                                   const float* base, const float* scale, int64_t d, float hc_eps, float rms_eps) {
  __shared__ float shared[5 * 32];
  __shared__ float wsh[4];
  const int64_t t = blockIdx.x, D = 4 * d;
  const bf16* x = X + t * D;
  float v[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xv = __bfloat162float(x[j]);
    v[0] += xv * fn[j];
    v[1] += xv * fn[D + j];
    v[2] += xv * fn[2 * D + j];
    v[3] += xv * fn[3 * D + j];
    v[4] += xv * xv;
  }
  block_sums<5>(v, shared);
  const float r = rsqrtf(v[4] / float(D) + rms_eps);
  if (threadIdx.x < 4) {
    const int i = threadIdx.x;
    const float m = v[i] * r;
    mix[t * 4 + i] = m;
    const float wi = sigm(scale[0] * m + base[i]) + hc_eps;
    w[t * 4 + i] = wi;
    wsh[i] = wi;
  }
  if (threadIdx.x == 0) rstd[t] = r;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc += wsh[i] * __bfloat162float(x[i * d + j]);
    y[t * d + j] = __float2bfloat16(acc);
  }
}

// Per token: dz, dmix*rstd (to scratch) and dX.
__global__ void hc_head_bwd_kernel(float* dX, float* dz_out, float* dmixr_out, const bf16* dy, const bf16* X,
                                   const float* fn, const float* base, const float* scale, const float* mix,
                                   const float* rstd, const float* w, int64_t d) {
  __shared__ float shared[4 * 32];
  __shared__ float coef[6];  // dmixr[4], corr
  const int64_t t = blockIdx.x, D = 4 * d;
  const bf16* x = X + t * D;
  const bf16* g = dy + t * d;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float gv = __bfloat162float(g[j]);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] += gv * __bfloat162float(x[i * d + j]);
  }
  block_sums<4>(v, shared);
  if (threadIdx.x == 0) {
    const float r = rstd[t];
    float corr = 0.f;
    for (int i = 0; i < 4; ++i) {
      const float sg = sigm(scale[0] * mix[t * 4 + i] + base[i]);
      const float dz = v[i] * sg * (1.f - sg);
      const float dmix = dz * scale[0];
      dz_out[t * 4 + i] = dz;
      corr += dmix * mix[t * 4 + i];
      coef[i] = dmix * r;
      dmixr_out[t * 4 + i] = dmix * r;
    }
    coef[4] = corr * r * r / float(D);
  }
  __syncthreads();
  float* dx = dX + t * D;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const int64_t i = j / d;
    float acc = w[t * 4 + i] * __bfloat162float(g[j - i * d]);
    acc += coef[0] * fn[j] + coef[1] * fn[D + j] + coef[2] * fn[2 * D + j] + coef[3] * fn[3 * D + j];
    acc -= coef[4] * __bfloat162float(x[j]);
    dx[j] += acc;
  }
}

__global__ void hc_head_small_grads_kernel(float* dbase, float* dscale, const float* dz, const float* mix,
                                           int64_t N) {
  __shared__ float shared[5 * 32];
  float v[5] = {0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x)
    for (int i = 0; i < 4; ++i) {
      v[i] += dz[t * 4 + i];
      v[4] += dz[t * 4 + i] * mix[t * 4 + i];
    }
  block_sums<5>(v, shared);
  if (threadIdx.x == 0) {
    if (dbase)
      for (int i = 0; i < 4; ++i) dbase[i] += v[i];
    if (dscale) dscale[0] += v[4];
  }
}

}  // namespace

void hc_head_fwd(bf16* y, float* mix, float* rstd, float* w, const bf16* X, const float* fn, const float* base,
                 const float* scale, int64_t N, int64_t d, float hc_eps, float rms_eps, cudaStream_t s) {
  if (N == 0) return;
  hc_head_fwd_kernel<<<unsigned(N), kThreads, 0, s>>>(y, mix, rstd, w, X, fn, base, scale, d, hc_eps, rms_eps);
  TREX_CUDA_LAUNCHED();
}

void hc_head_bwd(float* dX, float* dfn, float* dbase, float* dscale, const bf16* dy, const bf16* X,
                 const float* fn, const float* base, const float* scale, const float* mix, const float* rstd,
                 const float* w, int64_t N, int64_t d, float* scratch, cudaStream_t s) {
  if (N == 0) return;
  TREX_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0,
             "hc_head_bwd (CUDA): scratch must be 16-byte aligned (float4 rows of dmix)");
  float* dz = scratch;
  float* dmixr = scratch + 4 * N;
  hc_head_bwd_kernel<<<unsigned(N), kThreads, 0, s>>>(dX, dz, dmixr, dy, X, fn, base, scale, mix, rstd, w, d);
  TREX_CUDA_LAUNCHED();
  if (dfn) {
    token_weight_grad<4>(N, 4 * d, X, dmixr, dfn, nullptr, s);
    TREX_CUDA_LAUNCHED();
  }
  if (dbase || dscale) {
    hc_head_small_grads_kernel<<<1, 1024, 0, s>>>(dbase, dscale, dz, mix, N);
    TREX_CUDA_LAUNCHED();
  }
}

}  // namespace trex::cuda
