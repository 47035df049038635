#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/token_weight_grad.cuh"

namespace trex::cuda {
namespace {

constexpr int kN = kMhcStreams;
constexpr int kM = kMhcMix;
constexpr int kThreads = 256;
constexpr int kTok = 8;      // tokens per block in the site kernels: one warp each in the per-token phases
constexpr int kChunk = 256;  // columns of x staged per step of the mix projection
constexpr int kMaxSteps = 2 * kMhcMaxSinkhornIters - 1;

__device__ inline float sigm(float x) {
  return 1.f / (1.f + expf(-x));
}

// The 4 x 4 matrix lives on lanes 0..15 (lane = 4 i + j) and is mirrored on lanes 16..31.
__device__ inline float row_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ inline float col_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v + __shfl_xor_sync(0xffffffffu, v, 8);
}
__device__ inline float row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float row_softmax(float z) {
  const float e = expf(z - row_max(z));
  return e / row_sum(e);
}

// Step s of the Sinkhorn iterations normalises columns when s is even, rows when odd.
__device__ inline float normalise(float m, int step, float eps) {
  const float sum = (step % 2 == 0) ? col_sum(m) : row_sum(m);
  return m * (1.f / (sum + eps));
}

__device__ inline float sinkhorn_fwd_warp(float z, int iters, float eps) {
  float m = row_softmax(z) + eps;
  for (int s = 0; s < 2 * iters - 1; ++s) m = normalise(m, s, eps);
  return m;
}

// dlogits of this lane's element from dout (g); hist: this warp's [kMaxSteps][16] smem.
__device__ inline float sinkhorn_bwd_warp(float z, float g, int iters, float eps, float* hist) {
  const int li = threadIdx.x % 16;
  const bool writer = (threadIdx.x % 32) < 16;
  const float p = row_softmax(z);
  float m = p + eps;
  const int steps = 2 * iters - 1;
  for (int s = 0; s < steps; ++s) {
    if (writer) hist[s * 16 + li] = m;
    m = normalise(m, s, eps);
  }
  __syncwarp();
  for (int s = steps - 1; s >= 0; --s) {
    const float x = hist[s * 16 + li];
    const bool col = s % 2 == 0;
    const float inv = 1.f / ((col ? col_sum(x) : row_sum(x)) + eps);
    const float t = g * x * inv;
    const float dot = col ? col_sum(t) : row_sum(t);
    g = (g - dot) * inv;
  }
  return p * (g - row_sum(g * p));
}

__device__ inline void unpack8(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}
__device__ inline uint4 pack8(const float* f) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// 8 consecutive fp32 values as two 16-byte accesses (callers pass 32-byte aligned addresses).
__device__ inline void load8(const float* p, float* f) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ inline void store8(float* p, const float* f) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

__device__ inline int scale_group(int k) {
  return k < kN ? 0 : (k < 2 * kN ? 1 : 2);
}

// kTok tokens per block: the 24-wide projection through smem chunks (fn reused by the block's tokens), the
// gates and Sinkhorn (warp per token), then the collapse. Projection tiling: warp w owns mix rows 3w..3w+2 for
// all 8 tokens, lane l the chunk columns l, l + 32, ...; so each shared load of x feeds 3 FMAs and each load of
// fn 8 (warp 0 also sums x^2), and the lane partials meet in one butterfly per output (fixed order).
static_assert(kM == 3 * (kThreads / 32), "site_fwd_kernel: 8 warps x 3 mix rows");
__global__ void __launch_bounds__(kThreads)
    site_fwd_kernel(MhcDims s, const bf16* X, const float* fn, const float* base, const float* scale,
                    MhcActs a, bf16* collapsed) {
  __shared__ float xs[kTok][kChunk];
  __shared__ float fs[kM][kChunk + 1];
  __shared__ float rs[kTok], mixs[kTok][kM], pres[kTok][kN], raw[kTok][kM], ssq[kTok];
  const int tid = threadIdx.x, pw = tid / 32, pl = tid % 32;
  const int64_t t0 = int64_t(blockIdx.x) * kTok, D = kN * s.d;
  float acc[kTok][3], ss[kTok];
#pragma unroll
  for (int u = 0; u < kTok; ++u) acc[u][0] = acc[u][1] = acc[u][2] = ss[u] = 0.f;
  for (int64_t c0 = 0; c0 < D; c0 += kChunk) {
    const int64_t j = c0 + tid;
    for (int u = 0; u < kTok; ++u)
      xs[u][tid] = (t0 + u < s.n_tok && j < D) ? __bfloat162float(X[(t0 + u) * D + j]) : 0.f;
    for (int r = 0; r < kM; ++r) fs[r][tid] = j < D ? fn[r * D + j] : 0.f;
    __syncthreads();
#pragma unroll 2
    for (int jj = pl; jj < kChunk; jj += 32) {
      float xv[kTok];
#pragma unroll
      for (int u = 0; u < kTok; ++u) xv[u] = xs[u][jj];
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const float f = fs[3 * pw + c][jj];
#pragma unroll
        for (int u = 0; u < kTok; ++u) acc[u][c] = fmaf(f, xv[u], acc[u][c]);
      }
      if (pw == 0)
#pragma unroll
        for (int u = 0; u < kTok; ++u) ss[u] = fmaf(xv[u], xv[u], ss[u]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < kTok; ++u)
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const float v = warp_sum(acc[u][c]);
      if (pl == 0) raw[u][3 * pw + c] = v;
    }
  if (pw == 0)
#pragma unroll
    for (int u = 0; u < kTok; ++u) {
      const float v = warp_sum(ss[u]);
      if (pl == 0) ssq[u] = v;
    }
  __syncthreads();
  if (tid < kTok) {
    const float r = rsqrtf(ssq[tid] / float(D) + s.rms_eps);
    rs[tid] = r;
    if (t0 + tid < s.n_tok) a.rstd[t0 + tid] = r;
  }
  __syncthreads();
  if (tid < kTok * kM) {
    const int tt = tid / kM, k = tid % kM;
    const float m = raw[tt][k] * rs[tt];
    mixs[tt][k] = m;
    if (t0 + tt < s.n_tok) a.mix[(t0 + tt) * kM + k] = m;
  }
  __syncthreads();
  {
    const int w = tid / 32, lane = tid % 32, li = lane % 16;
    const int64_t t = t0 + w;
    if (t < s.n_tok) {  // warp-uniform
      if (lane < kN) {
        const float p = sigm(scale[0] * mixs[w][lane] + base[lane]) + s.hc_eps;
        pres[w][lane] = p;
        a.pre[t * kN + lane] = p;
      } else if (lane < 2 * kN) {
        a.post[t * kN + lane - kN] = 2.f * sigm(scale[1] * mixs[w][lane] + base[lane]);
      }
      const float z = scale[2] * mixs[w][2 * kN + li] + base[2 * kN + li];
      const float c = sinkhorn_fwd_warp(z, s.sinkhorn_iters, s.hc_eps);
      if (lane < 16) a.comb[t * 16 + li] = c;
    }
  }
  __syncthreads();
  for (int u = 0; u < kTok; ++u) {
    const int64_t t = t0 + u;
    if (t >= s.n_tok) break;
    for (int64_t v = tid; v < s.d / 8; v += kThreads) {
      float out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < kN; ++i) {
        float f[8];
        unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) out[e] = fmaf(pres[u][i], f[e], out[e]);
      }
      reinterpret_cast<uint4*>(collapsed + t * s.d)[v] = pack8(out);
    }
  }
}

__global__ void expand_fwd_kernel(MhcDims s, const bf16* X, const bf16* y, const float* post,
                                  const float* comb, bf16* Xout) {
  __shared__ float ps[kN], cs[16];
  const int64_t t = blockIdx.x, D = kN * s.d;
  if (threadIdx.x < kN) ps[threadIdx.x] = post[t * kN + threadIdx.x];
  if (threadIdx.x < 16) cs[threadIdx.x] = comb[t * 16 + threadIdx.x];
  __syncthreads();
  for (int64_t v = threadIdx.x; v < s.d / 8; v += blockDim.x) {
    float xf[kN][8], yf[8];
    for (int i = 0; i < kN; ++i) unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], xf[i]);
    unpack8(reinterpret_cast<const uint4*>(y + t * s.d)[v], yf);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      float o[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float acc = ps[j] * yf[e];
#pragma unroll
        for (int i = 0; i < kN; ++i) acc = fmaf(cs[i * kN + j], xf[i][e], acc);
        o[e] = acc;
      }
      reinterpret_cast<uint4*>(Xout + t * D + j * s.d)[v] = pack8(o);
    }
  }
}

// Block per token: dX, dy (accumulated) elementwise; dpost, dcomb through a fixed-order block reduction.
// At most 128 registers, so two blocks (16 warps) share an SM: the kernel is bandwidth-bound.
__global__ void __launch_bounds__(kThreads, 2)
    expand_bwd_kernel(MhcDims s, const bf16* X, const bf16* y, const float* post, const float* comb,
                      const float* dXout, float* dX, float* dy, float* dpost, float* dcomb) {
  __shared__ float ps[kN], cs[16], red[kThreads / 32][kN + 16];
  const int64_t t = blockIdx.x, D = kN * s.d;
  if (threadIdx.x < kN) ps[threadIdx.x] = post[t * kN + threadIdx.x];
  if (threadIdx.x < 16) cs[threadIdx.x] = comb[t * 16 + threadIdx.x];
  __syncthreads();
  float part[kN + 16];
#pragma unroll
  for (int r = 0; r < kN + 16; ++r) part[r] = 0.f;
  for (int64_t v = threadIdx.x; v < s.d / 8; v += blockDim.x) {
    float xf[kN][8], yf[8], g[kN][8];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], xf[i]);
      load8(dXout + t * D + i * s.d + v * 8, g[i]);
    }
    unpack8(reinterpret_cast<const uint4*>(y + t * s.d)[v], yf);
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        part[j] = fmaf(g[j][e], yf[e], part[j]);
#pragma unroll
        for (int i = 0; i < kN; ++i) part[kN + i * kN + j] = fmaf(g[j][e], xf[i][e], part[kN + i * kN + j]);
      }
    // dy and each dX stream: one 32-byte read-modify-write per thread (x, y are dead by now: fewer registers).
    float o[8];
    load8(dy + t * s.d + v * 8, o);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < kN; ++j) acc = fmaf(ps[j], g[j][e], acc);
      o[e] += acc;
    }
    store8(dy + t * s.d + v * 8, o);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      load8(dX + t * D + i * s.d + v * 8, o);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < kN; ++j) acc = fmaf(cs[i * kN + j], g[j][e], acc);
        o[e] += acc;
      }
      store8(dX + t * D + i * s.d + v * 8, o);
    }
  }
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kN + 16; ++r) {
    const float x = warp_sum(part[r]);
    if (lane == 0) red[w][r] = x;
  }
  __syncthreads();
  if (threadIdx.x < kN + 16) {
    float acc = 0.f;
    for (int u = 0; u < kThreads / 32; ++u) acc += red[u][threadIdx.x];
    if (threadIdx.x < kN)
      dpost[t * kN + threadIdx.x] = acc;
    else
      dcomb[t * 16 + threadIdx.x - kN] = acc;
  }
}

// Site backward, kTok tokens per block. Warp w: token t0 + w's collapse dot products, gate derivatives and
// Sinkhorn backward -> dz (pre-activation grads), dmix_s = dz * scale * rstd, corr. Then all threads: dX over
// the 4d columns (fn column in registers, reused by the block's tokens).
__global__ void __launch_bounds__(kThreads)
    site_bwd_kernel(MhcDims s, const bf16* X, const float* fn, const float* base, const float* scale,
                    MhcActs a, const bf16* dcol, const float* dpost, const float* dcomb, float* dX,
                    float* dz_out, float* dmixs_out) {
  __shared__ float hist[kTok][kMaxSteps * 16];
  __shared__ float dms[kTok][kM], corr[kTok], pres[kTok][kN];
  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, li = lane % 16;
  const int64_t t0 = int64_t(blockIdx.x) * kTok, D = kN * s.d, t = t0 + w;
  if (t < s.n_tok) {  // warp-uniform
    float dp[kN] = {0, 0, 0, 0};
    for (int64_t v = lane; v < s.d / 8; v += 32) {
      float g[8];
      unpack8(reinterpret_cast<const uint4*>(dcol + t * s.d)[v], g);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float xf[8];
        unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) dp[i] = fmaf(g[e], xf[e], dp[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) dp[i] = warp_sum(dp[i]);
    const float* mx = a.mix + t * kM;
    float z = 0.f;
    if (lane < kN) {
      float dpl = dp[0];
#pragma unroll
      for (int i = 1; i < kN; ++i)
        if (lane == i) dpl = dp[i];
      const float sg = sigm(scale[0] * mx[lane] + base[lane]);
      z = dpl * sg * (1.f - sg);
      pres[w][lane] = a.pre[t * kN + lane];
    } else if (lane < 2 * kN) {
      const float sp = sigm(scale[1] * mx[lane] + base[lane]);
      z = dpost[t * kN + lane - kN] * 2.f * sp * (1.f - sp);
    }
    const float zl = scale[2] * mx[2 * kN + li] + base[2 * kN + li];
    const float dl = sinkhorn_bwd_warp(zl, dcomb[t * 16 + li], s.sinkhorn_iters, s.hc_eps, hist[w]);
    const float dl_k = __shfl_sync(0xffffffffu, dl, (lane - 2 * kN) & 15);
    if (lane >= 2 * kN) z = lane < kM ? dl_k : 0.f;
    const float r = a.rstd[t];
    const float dmix = lane < kM ? z * scale[scale_group(lane)] : 0.f;
    const float c = warp_sum(lane < kM ? dmix * mx[lane] : 0.f) * r * r / float(D);
    if (lane < kM) {
      dz_out[t * kM + lane] = z;
      dms[w][lane] = dmix * r;
      dmixs_out[t * kM + lane] = dmix * r;
    }
    if (lane == 0) corr[w] = c;
  }
  __syncthreads();
  for (int64_t j = tid; j < D; j += kThreads) {
    float f[kM];
#pragma unroll
    for (int k = 0; k < kM; ++k) f[k] = fn[k * D + j];
    const int i = int(j / s.d);
    const int64_t e = j % s.d;
    for (int u = 0; u < kTok; ++u) {
      const int64_t tu = t0 + u;
      if (tu >= s.n_tok) break;
      float acc =
          pres[u][i] * __bfloat162float(dcol[tu * s.d + e]) - corr[u] * __bfloat162float(X[tu * D + j]);
#pragma unroll
      for (int k = 0; k < kM; ++k) acc = fmaf(dms[u][k], f[k], acc);
      dX[tu * D + j] += acc;
    }
  }
}

// dbase[k] += sum_t dz[t, k]; dscale[group(k)] += sum_t dz[t, k] mix[t, k]. One block: thread u sums tokens
// t = u, u + 256, ... for all 24 k at once (its rows are contiguous), then warp sums and a fixed-order sum over
// the warps (deterministic).
__global__ void __launch_bounds__(kThreads)
    site_param_grads_kernel(int64_t n, const float* dz, const float* mix, float* dbase, float* dscale) {
  __shared__ float red[kThreads / 32][2 * kM];
  __shared__ float tot[2 * kM];
  float b[kM], sc[kM];
#pragma unroll
  for (int k = 0; k < kM; ++k) b[k] = 0.f, sc[k] = 0.f;
  for (int64_t t = threadIdx.x; t < n; t += kThreads) {
#pragma unroll
    for (int k = 0; k < kM; ++k) {
      const float z = dz[t * kM + k];
      b[k] += z;
      sc[k] = fmaf(z, mix[t * kM + k], sc[k]);
    }
  }
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < kM; ++k) {
    const float x = warp_sum(b[k]), y = warp_sum(sc[k]);
    if (lane == 0) red[w][k] = x, red[w][kM + k] = y;
  }
  __syncthreads();
  if (threadIdx.x < 2 * kM) {
    float acc = 0.f;
    for (int u = 0; u < kThreads / 32; ++u) acc += red[u][threadIdx.x];
    tot[threadIdx.x] = acc;
  }
  __syncthreads();
  if (threadIdx.x < kM && dbase) dbase[threadIdx.x] += tot[threadIdx.x];
  if (threadIdx.x == 0 && dscale)
    for (int k = 0; k < kM; ++k) dscale[scale_group(k)] += tot[kM + k];
}

void check_dims(const MhcDims& s) {
  TREX_CHECK(s.d > 0 && s.d % 8 == 0, "mHC (CUDA): stream width d = {} must be a positive multiple of 8",
             s.d);
  TREX_CHECK(s.sinkhorn_iters >= 1 && s.sinkhorn_iters <= kMhcMaxSinkhornIters,
             "mHC (CUDA): hc_sinkhorn_iters = {} out of range 1..{}", s.sinkhorn_iters, kMhcMaxSinkhornIters);
}

unsigned token_blocks(int64_t n) {
  return unsigned((n + kTok - 1) / kTok);
}

}  // namespace

void mhc_site_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, bf16* collapsed, cudaStream_t stream) {
  check_dims(s);
  if (s.n_tok == 0) return;
  site_fwd_kernel<<<token_blocks(s.n_tok), kThreads, 0, stream>>>(s, X, fn, base, scale, a, collapsed);
  TREX_CUDA_LAUNCHED();
}

void mhc_expand_fwd(const MhcDims& s, const bf16* X, const bf16* y, const float* post, const float* comb,
                    bf16* Xout, cudaStream_t stream) {
  check_dims(s);
  if (s.n_tok == 0) return;
  expand_fwd_kernel<<<unsigned(s.n_tok), kThreads, 0, stream>>>(s, X, y, post, comb, Xout);
  TREX_CUDA_LAUNCHED();
}

void mhc_expand_bwd(const MhcDims& s, const bf16* X, const bf16* y, const float* post, const float* comb,
                    const float* dXout, float* dX, float* dy, float* dpost, float* dcomb,
                    cudaStream_t stream) {
  check_dims(s);
  if (s.n_tok == 0) return;
  expand_bwd_kernel<<<unsigned(s.n_tok), kThreads, 0, stream>>>(s, X, y, post, comb, dXout, dX, dy, dpost,
                                                                dcomb);
  TREX_CUDA_LAUNCHED();
}

int64_t mhc_site_bwd_scratch(const MhcDims& s) {
  return 2 * s.n_tok * kM + token_weight_grad_scratch(s.n_tok, kM, kN * s.d);
}

void mhc_site_bwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, const bf16* dcollapsed, const float* dpost, const float* dcomb, float* dX,
                  float* dfn, float* dbase, float* dscale, float* scratch, cudaStream_t stream) {
  check_dims(s);
  if (s.n_tok == 0) return;
  TREX_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0,
             "mhc_site_bwd (CUDA): scratch must be 16-byte aligned (float4 rows of dmix)");
  float* dz = scratch;
  float* dmixs = scratch + s.n_tok * kM;
  site_bwd_kernel<<<token_blocks(s.n_tok), kThreads, 0, stream>>>(s, X, fn, base, scale, a, dcollapsed, dpost,
                                                                  dcomb, dX, dz, dmixs);
  TREX_CUDA_LAUNCHED();
  if (dbase || dscale) {
    site_param_grads_kernel<<<1, kThreads, 0, stream>>>(s.n_tok, dz, a.mix, dbase, dscale);
    TREX_CUDA_LAUNCHED();
  }
  if (dfn) {
    const int64_t D = kN * s.d;
    token_weight_grad<kM>(s.n_tok, D, X, dmixs, dfn, scratch + 2 * s.n_tok * kM, stream);
    TREX_CUDA_LAUNCHED();
  }
}

}  // namespace trex::cuda
