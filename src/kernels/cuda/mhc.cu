#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mhc.h"

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

__device__ inline int scale_group(int k) {
  return k < kN ? 0 : (k < 2 * kN ? 1 : 2);
}

// kTok tokens per block: the 24-wide projection through smem chunks (fn reused by the block's tokens), the
// gates and Sinkhorn (warp per token), then the collapse.
__global__ void __launch_bounds__(kThreads)
    site_fwd_kernel(MhcDims s, const bf16* X, const float* fn, const float* base, const float* scale,
                    MhcActs a, bf16* collapsed) {
  __shared__ float xs[kTok][kChunk];
  __shared__ float fs[kM][kChunk + 1];
  __shared__ float rs[kTok], mixs[kTok][kM], pres[kTok][kN];
  const int tid = threadIdx.x;
  const int64_t t0 = int64_t(blockIdx.x) * kTok, D = kN * s.d;
  const int tt = tid / kM, k = tid % kM;  // projection role (tid < 192)
  float acc = 0.f, ss = 0.f;
  for (int64_t c0 = 0; c0 < D; c0 += kChunk) {
    const int64_t j = c0 + tid;
    for (int u = 0; u < kTok; ++u)
      xs[u][tid] = (t0 + u < s.n_tok && j < D) ? __bfloat162float(X[(t0 + u) * D + j]) : 0.f;
    for (int r = 0; r < kM; ++r) fs[r][tid] = j < D ? fn[r * D + j] : 0.f;
    __syncthreads();
    if (tid < kTok * kM) {
#pragma unroll 8
      for (int jj = 0; jj < kChunk; ++jj) acc = fmaf(fs[k][jj], xs[tt][jj], acc);
    } else if (tid < kTok * kM + kTok) {
      const int u = tid - kTok * kM;
#pragma unroll 8
      for (int jj = 0; jj < kChunk; ++jj) ss = fmaf(xs[u][jj], xs[u][jj], ss);
    }
    __syncthreads();
  }
  if (tid >= kTok * kM && tid < kTok * kM + kTok) {
    const int u = tid - kTok * kM;
    const float r = rsqrtf(ss / float(D) + s.rms_eps);
    rs[u] = r;
    if (t0 + u < s.n_tok) a.rstd[t0 + u] = r;
  }
  __syncthreads();
  if (tid < kTok * kM) {
    const float m = acc * rs[tt];
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
__global__ void __launch_bounds__(kThreads)
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
    for (int i = 0; i < kN; ++i) {
      unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], xf[i]);
      const float4* gp = reinterpret_cast<const float4*>(dXout + t * D + i * s.d + v * 8);
      const float4 a = gp[0], b = gp[1];
      g[i][0] = a.x, g[i][1] = a.y, g[i][2] = a.z, g[i][3] = a.w;
      g[i][4] = b.x, g[i][5] = b.y, g[i][6] = b.z, g[i][7] = b.w;
    }
    unpack8(reinterpret_cast<const uint4*>(y + t * s.d)[v], yf);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float dyv = 0.f;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        part[j] = fmaf(g[j][e], yf[e], part[j]);
        dyv = fmaf(ps[j], g[j][e], dyv);
#pragma unroll
        for (int i = 0; i < kN; ++i) part[kN + i * kN + j] = fmaf(g[j][e], xf[i][e], part[kN + i * kN + j]);
      }
      dy[t * s.d + v * 8 + e] += dyv;
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < kN; ++j) acc = fmaf(cs[i * kN + j], g[j][e], acc);
        dX[t * D + i * s.d + v * 8 + e] += acc;
      }
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

// dbase[k] += sum_t dz[t, k]; dscale[group(k)] += sum_t dz[t, k] mix[t, k]. One block, fixed order.
__global__ void site_param_grads_kernel(int64_t n, const float* dz, const float* mix, float* dbase,
                                        float* dscale) {
  __shared__ float red[2][kThreads];
  __shared__ float ds_k[kM];
  for (int k = 0; k < kM; ++k) {
    float b = 0.f, sc = 0.f;
    for (int64_t t = threadIdx.x; t < n; t += kThreads) {
      b += dz[t * kM + k];
      sc = fmaf(dz[t * kM + k], mix[t * kM + k], sc);
    }
    red[0][threadIdx.x] = b;
    red[1][threadIdx.x] = sc;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) {
        red[0][threadIdx.x] += red[0][threadIdx.x + w];
        red[1][threadIdx.x] += red[1][threadIdx.x + w];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (dbase) dbase[k] += red[0][0];
      ds_k[k] = red[1][0];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && dscale)
    for (int k = 0; k < kM; ++k) dscale[scale_group(k)] += ds_k[k];
}

constexpr int kDfnCols = 128;
constexpr int kDfnStage = 64;

// dfn[k, j] += sum_t dmix_s[t, k] X[t, j]: 128 columns per block, two token halves combined in a fixed order.
__global__ void __launch_bounds__(kThreads)
    dfn_kernel(int64_t n, int64_t D, const bf16* X, const float* dmixs, float* dfn) {
  __shared__ float dm[kDfnStage][kM];
  __shared__ float part[kDfnCols][kM + 1];
  const int col = threadIdx.x % kDfnCols, half = threadIdx.x / kDfnCols;
  const int64_t j = int64_t(blockIdx.x) * kDfnCols + col;
  float acc[kM];
#pragma unroll
  for (int k = 0; k < kM; ++k) acc[k] = 0.f;
  for (int64_t s0 = 0; s0 < n; s0 += kDfnStage) {
    for (int idx = threadIdx.x; idx < kDfnStage * kM; idx += kThreads) {
      const int64_t t = s0 + idx / kM;
      dm[idx / kM][idx % kM] = t < n ? dmixs[t * kM + idx % kM] : 0.f;
    }
    __syncthreads();
    if (j < D)
      for (int u = half; u < kDfnStage && s0 + u < n; u += 2) {
        const float x = __bfloat162float(X[(s0 + u) * D + j]);
#pragma unroll
        for (int k = 0; k < kM; ++k) acc[k] = fmaf(dm[u][k], x, acc[k]);
      }
    __syncthreads();
  }
  if (half == 1)
#pragma unroll
    for (int k = 0; k < kM; ++k) part[col][k] = acc[k];
  __syncthreads();
  if (half == 0 && j < D)
#pragma unroll
    for (int k = 0; k < kM; ++k) dfn[k * D + j] += acc[k] + part[col][k];
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
  return 2 * s.n_tok * kM;
}

void mhc_site_bwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, const bf16* dcollapsed, const float* dpost, const float* dcomb, float* dX,
                  float* dfn, float* dbase, float* dscale, float* scratch, cudaStream_t stream) {
  check_dims(s);
  if (s.n_tok == 0) return;
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
    dfn_kernel<<<unsigned((D + kDfnCols - 1) / kDfnCols), kThreads, 0, stream>>>(s.n_tok, D, X, dmixs, dfn);
    TREX_CUDA_LAUNCHED();
  }
}

}  // namespace trex::cuda
