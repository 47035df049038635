#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hc_head.h"
#include "kernels/cuda/token_weight_grad.cuh"

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

// Sums v[0..K) over the block; every thread gets the totals. shared: [K][32].
template <int K>
__device__ inline void block_sums(float* v, float* shared) {
  reduce::block_sums<K>(v, shared, 32);
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
  if (!y) return;  // the caller collapses (mhc_collapse_norm_fwd keeps the collapse in fp32)
  __syncthreads();
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc += wsh[i] * __bfloat162float(x[i * d + j]);
    y[t * d + j] = __float2bfloat16(acc);
  }
}

// Per token: dz, dmix*rstd (to scratch) and dX.
__global__ void hc_head_bwd_kernel(float* dX, float* dz_out, float* dmixr_out, const float* dy, const bf16* X,
                                   const float* fn, const float* base, const float* scale, const float* mix,
                                   const float* rstd, const float* w, int64_t d, const float* dpre, bool accum) {
  __shared__ float shared[4 * 32];
  __shared__ float coef[6];  // dmixr[4], corr
  const int64_t t = blockIdx.x, D = 4 * d;
  const bf16* x = X + t * D;
  const float* g = dy + t * d;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (dpre) {  // dy . X[i] from mhc_collapse_norm_bwd
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = dpre[t * 4 + i];
  } else {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float gv = g[j];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] += gv * __bfloat162float(x[i * d + j]);
    }
    block_sums<4>(v, shared);
  }
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
    float acc = w[t * 4 + i] * g[j - i * d];
    acc += coef[0] * fn[j] + coef[1] * fn[D + j] + coef[2] * fn[2 * D + j] + coef[3] * fn[3 * D + j];
    acc -= coef[4] * __bfloat162float(x[j]);
    dx[j] = accum ? dx[j] + acc : acc;
  }
}

// The same backward for 16 tokens per block (d even): the per-token phase (dz, dmix * rstd, corr: the math of
// hc_head_bwd_kernel's thread 0) for the block's tokens, then dX over two adjacent columns per thread with the 4
// fn values of each column in registers, reused by the 16 tokens (the per-token kernel reads all of fn, 4 x 4d
// fp32, from L2 for every token). The columns are split over gridDim.y blocks, as mhc.cu's site backward.
constexpr int kTokH = 16;
constexpr int kColSplitH = 2;
__global__ void __launch_bounds__(256)
    hc_head_bwd_tok_kernel(float* dX, float* dz_out, float* dmixr_out, const float* dy, const bf16* X,
                           const float* fn, const float* base, const float* scale, const float* mix,
                           const float* rstd, const float* w, int64_t N, int64_t d, const float* dpre, bool accum) {
  __shared__ float vsh[kTokH][4], wsh[kTokH][4], cf[kTokH][5];
  const int tid = threadIdx.x, wp = tid / 32, lane = tid % 32;
  const int64_t t0 = int64_t(blockIdx.x) * kTokH, D = 4 * d;
  for (int u = wp; u < kTokH; u += 8) {  // warp per token: dy . X[i]
    const int64_t t = t0 + u;
    if (t >= N) break;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (dpre) {
      if (lane == 0)
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = dpre[t * 4 + i];
    } else {
      for (int64_t e = lane; e < d; e += 32) {
        const float gv = dy[t * d + e];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] += gv * __bfloat162float(X[t * D + i * d + e]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = reduce::warp_sum(v[i]);
    if (lane < 4) vsh[u][lane] = lane == 0 ? v[0] : lane == 1 ? v[1] : lane == 2 ? v[2] : v[3];
  }
  __syncthreads();
  if (tid < kTokH && t0 + tid < N) {
    const int64_t t = t0 + tid;
    const float r = rstd[t];
    float corr = 0.f;
    for (int i = 0; i < 4; ++i) {
      const float sg = sigm(scale[0] * mix[t * 4 + i] + base[i]);
      const float dz = vsh[tid][i] * sg * (1.f - sg);
      const float dmix = dz * scale[0];
      corr += dmix * mix[t * 4 + i];
      cf[tid][i] = dmix * r;
      wsh[tid][i] = w[t * 4 + i];
      if (blockIdx.y == 0) dz_out[t * 4 + i] = dz, dmixr_out[t * 4 + i] = dmix * r;
    }
    cf[tid][4] = corr * r * r / float(D);
  }
  __syncthreads();
  const int n_u = int(N - t0 < kTokH ? N - t0 : kTokH);
  const int64_t j_lo = int64_t(blockIdx.y) * (D / kColSplitH), j_hi = j_lo + D / kColSplitH;
  for (int64_t j = j_lo + 2 * int64_t(tid); j < j_hi; j += 2 * 256) {  // d even: both columns in stream i
    const int i = int(j / d);
    const int64_t e = j - int64_t(i) * d;
    float f0[4], f1[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) f0[k] = fn[k * D + j], f1[k] = fn[k * D + j + 1];
#pragma unroll 4
    for (int u = 0; u < n_u; ++u) {
      const int64_t tu = t0 + u;
      const float2 g = *reinterpret_cast<const float2*>(dy + tu * d + e);
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(X + tu * D + j));
      float a0 = wsh[u][i] * g.x, a1 = wsh[u][i] * g.y;
      a0 += cf[u][0] * f0[0] + cf[u][1] * f0[1] + cf[u][2] * f0[2] + cf[u][3] * f0[3];
      a1 += cf[u][0] * f1[0] + cf[u][1] * f1[1] + cf[u][2] * f1[2] + cf[u][3] * f1[3];
      a0 -= cf[u][4] * x.x, a1 -= cf[u][4] * x.y;
      float2* o = reinterpret_cast<float2*>(dX + tu * D + j);
      if (accum) {
        const float2 old = *o;
        a0 += old.x, a1 += old.y;
      }
      *o = make_float2(a0, a1);
    }
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

void hc_head_bwd(float* dX, float* dfn, float* dbase, float* dscale, const float* dy, const bf16* X,
                 const float* fn, const float* base, const float* scale, const float* mix, const float* rstd,
                 const float* w, int64_t N, int64_t d, float* scratch, cudaStream_t s, const float* dpre,
                 bool accumulate) {
  if (N == 0) return;
  TREX_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0,
             "hc_head_bwd (CUDA): scratch must be 16-byte aligned (float4 rows of dmix)");
  float* dz = scratch;
  float* dmixr = scratch + 4 * N;
  if (d % 2 == 0 && reinterpret_cast<uintptr_t>(dy) % 8 == 0 && reinterpret_cast<uintptr_t>(dX) % 8 == 0)
    hc_head_bwd_tok_kernel<<<dim3(unsigned((N + kTokH - 1) / kTokH), kColSplitH), 256, 0, s>>>(
        dX, dz, dmixr, dy, X, fn, base, scale, mix, rstd, w, N, d, dpre, accumulate);
  else
    hc_head_bwd_kernel<<<unsigned(N), kThreads, 0, s>>>(dX, dz, dmixr, dy, X, fn, base, scale, mix, rstd, w, d,
                                                        dpre, accumulate);
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
