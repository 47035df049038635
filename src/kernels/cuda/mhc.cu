#include <cooperative_groups.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mhc.h"
#include "kernels/cuda/token_weight_grad.cuh"
#include "kernels/cuda/vec_io.cuh"

namespace trex::cuda {
namespace {

constexpr int kN = kMhcStreams;
constexpr int kM = kMhcMix;
constexpr int kThreads = 256;
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
using reduce::warp_sum;

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

using vec::unpack8;
using vec::pack8;

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

// kTokF = 16 tokens per block: the 24-wide projection through smem chunks (each fn chunk, read from L2, reused
// by the block's 16 tokens), the gates and Sinkhorn (warp per token, two each), then the collapse. Projection
// tiling: warp w owns mix rows 3w..3w+2 for all 16 tokens, lane l the chunk columns l, l + 32, ...; so each
// shared load of x feeds 3 FMAs and each load of fn 16 (warp w also sums x^2 of tokens 2w, 2w + 1), and the
// lane partials meet in one butterfly per output (fixed order).
// kSplit > 1 (few tokens, e.g. a decode step): a cluster of kSplit blocks shares one token block, each
// projecting its own range of chunks; rank 0 sums the partial projections from the others' shared memory in
// rank order (deterministic, no scratch) and finishes alone. A lone block would stream all of fn (24 x 4d
// fp32, 1.5 MB at d = 4096) through one SM.
static_assert(kM == 3 * (kThreads / 32), "site_fwd_kernel: 8 warps x 3 mix rows");
// With a norm (nw non-null): the collapse stays fp32 and is normalised in place, normed = nw * c * rstd (the
// fp32 collapse staged in the projection's shared memory, d <= kNormMaxWidth), with the operation order of
// mhc_collapse_norm_fwd / _bwd (mhc_norm.cu), whose backward recomputes it.
// With proj (non-null, kSplit = 1 only): the projection is given, proj [N, 48] = X [fn_hi; fn_lo]^T (a GEMM on
// the tensor cores, mhc_split_bf16), raw = hi + lo; the kernel only sums x^2 (warp w: tokens 2w, 2w + 1).
struct SiteNorm {
  const bf16* w = nullptr;  // [d]
  bf16* normed = nullptr;   // [N, d]
  float* rstd = nullptr;    // [N]
  float eps = 0.f;
  const float* proj = nullptr;
};
constexpr int kTokF = 16;
constexpr int kPoolFloats = kTokF * kChunk + kM * (kChunk + 1);
constexpr int64_t kNormMaxWidth = (kPoolFloats / 8) * 8;
template <int kSplit>
__global__ void __launch_bounds__(kThreads, 2)  // <= 128 registers: two blocks (16 warps) per SM
    site_fwd_kernel(MhcDims s, const bf16* X, const float* fn, const float* base, const float* scale,
                    MhcActs a, bf16* collapsed, SiteNorm nrm) {
  __shared__ __align__(16) float pool[kPoolFloats];  // projection: xs, fs; then the norm's fp32 collapse
  float (*xs)[kChunk] = reinterpret_cast<float (*)[kChunk]>(pool);
  float (*fs)[kChunk + 1] = reinterpret_cast<float (*)[kChunk + 1]>(pool + kTokF * kChunk);
  __shared__ float rs[kTokF], mixs[kTokF][kM], pres[kTokF][kN], raw[kTokF][kM], ssq[kTokF], red[kThreads / 32];
  const int tid = threadIdx.x, pw = tid / 32, pl = tid % 32;
  const int rank = kSplit > 1 ? int(blockIdx.x % kSplit) : 0;
  const int64_t t0 = int64_t(blockIdx.x / kSplit) * kTokF, D = kN * s.d;
  const int64_t chunks = (D + kChunk - 1) / kChunk;
  const int64_t c_lo = chunks * rank / kSplit * kChunk, c_hi = chunks * (rank + 1) / kSplit * kChunk;
  static_assert(kTokF == 2 * (kThreads / 32), "site_fwd_kernel: warp w sums x^2 of tokens 2w, 2w + 1");
  float acc[kTokF][3], ss[2] = {0.f, 0.f};
#pragma unroll
  for (int u = 0; u < kTokF; ++u) acc[u][0] = acc[u][1] = acc[u][2] = 0.f;
  for (int64_t c0 = nrm.proj ? c_hi : c_lo; c0 < c_hi; c0 += kChunk) {  // no chunks when proj is given
    const int64_t j = c0 + tid;
    for (int u = 0; u < kTokF; ++u)
      xs[u][tid] = (t0 + u < s.n_tok && j < D) ? __bfloat162float(X[(t0 + u) * D + j]) : 0.f;
    for (int r = 0; r < kM; ++r) fs[r][tid] = j < D ? fn[r * D + j] : 0.f;
    __syncthreads();
#pragma unroll 2
    for (int jj = pl; jj < kChunk; jj += 32) {
      float xv[kTokF];
#pragma unroll
      for (int u = 0; u < kTokF; ++u) xv[u] = xs[u][jj];
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const float f = fs[3 * pw + c][jj];
#pragma unroll
        for (int u = 0; u < kTokF; ++u) acc[u][c] = fmaf(f, xv[u], acc[u][c]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
      for (int jj = pl; jj < kChunk; jj += 32) {
        const float x = xs[2 * pw + h][jj];
        ss[h] = fmaf(x, x, ss[h]);
      }
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < kTokF; ++u)
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const float v = warp_sum(acc[u][c]);
      if (pl == 0) raw[u][3 * pw + c] = v;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float v = warp_sum(ss[h]);
    if (pl == 0) ssq[2 * pw + h] = v;
  }
  __syncthreads();
  if (nrm.proj) {  // block-uniform; kSplit == 1
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = t0 + 2 * pw + h;
      float sq = 0.f;
      if (t < s.n_tok)
        for (int64_t v = pl; v < D / 8; v += 32) {
          float f[8];
          unpack8(reinterpret_cast<const uint4*>(X + t * D)[v], f);
#pragma unroll
          for (int e = 0; e < 8; ++e) sq = fmaf(f[e], f[e], sq);
        }
      sq = warp_sum(sq);
      if (pl == 0) ssq[2 * pw + h] = sq;
    }
    for (int v = tid; v < kTokF * kM; v += kThreads) {
      const int u = v / kM, k = v % kM;
      const int64_t t = t0 + u;
      raw[u][k] = t < s.n_tok ? nrm.proj[t * 2 * kM + k] + nrm.proj[t * 2 * kM + kM + k] : 0.f;
    }
    __syncthreads();
  }
  if constexpr (kSplit > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's partials are in its shared memory
    constexpr int kVals = kTokF * kM + kTokF;  // raw, then ssq
    constexpr int kPer = (kVals + kThreads - 1) / kThreads;
    auto val = [&](int v) { return v < kTokF * kM ? &raw[0][0] + v : ssq + (v - kTokF * kM); };
    float tot[kPer];
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      tot[q] = 0.f;
      const int v = tid + q * kThreads;
      if (rank == 0 && v < kVals)
        for (int r = 0; r < kSplit; ++r) tot[q] += *cluster.map_shared_rank(val(v), r);
    }
    cluster.sync();  // rank 0 has read everything: the others may exit, rank 0 may overwrite its own
    if (rank != 0) return;
#pragma unroll
    for (int q = 0; q < kPer; ++q)
      if (tid + q * kThreads < kVals) *val(tid + q * kThreads) = tot[q];
    __syncthreads();
  }
  if (tid < kTokF) {
    const float r = rsqrtf(ssq[tid] / float(D) + s.rms_eps);
    rs[tid] = r;
    if (t0 + tid < s.n_tok) a.rstd[t0 + tid] = r;
  }
  __syncthreads();
  for (int v = tid; v < kTokF * kM; v += kThreads) {
    const int tt = v / kM, k = v % kM;
    const float m = raw[tt][k] * rs[tt];
    mixs[tt][k] = m;
    if (t0 + tt < s.n_tok) a.mix[(t0 + tt) * kM + k] = m;
  }
  __syncthreads();
  for (int u = tid / 32; u < kTokF; u += kThreads / 32) {  // warp per token
    const int lane = tid % 32, li = lane % 16;
    const int64_t t = t0 + u;
    if (t >= s.n_tok) break;  // warp-uniform
    if (lane < kN) {
      const float p = sigm(scale[0] * mixs[u][lane] + base[lane]) + s.hc_eps;
      pres[u][lane] = p;
      a.pre[t * kN + lane] = p;
    } else if (lane < 2 * kN) {
      a.post[t * kN + lane - kN] = 2.f * sigm(scale[1] * mixs[u][lane] + base[lane]);
    }
    const float z = scale[2] * mixs[u][2 * kN + li] + base[2 * kN + li];
    const float c = sinkhorn_fwd_warp(z, s.sinkhorn_iters, s.hc_eps);
    if (lane < 16) a.comb[t * 16 + li] = c;
  }
  if (nrm.w) {
    __syncthreads();
    for (int u = 0; u < kTokF; ++u) {
      const int64_t t = t0 + u;
      if (t >= s.n_tok) break;  // block-uniform
      float ss = 0.f;
      for (int64_t v = tid; v < s.d / 8; v += kThreads) {
        float out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < kN; ++i) {
          float f[8];
          unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], f);
#pragma unroll
          for (int e = 0; e < 8; ++e) out[e] = fmaf(pres[u][i], f[e], out[e]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) ss = fmaf(out[e], out[e], ss);
        store8(pool + v * 8, out);  // this thread's own entries
      }
      ss = warp_sum(ss);
      if (tid % 32 == 0) red[tid / 32] = ss;
      __syncthreads();
      float tot = 0.f;
      for (int q = 0; q < kThreads / 32; ++q) tot += red[q];  // fixed order
      const float r = rsqrtf(tot / float(s.d) + nrm.eps);
      if (tid == 0) nrm.rstd[t] = r;
      for (int64_t v = tid; v < s.d / 8; v += kThreads) {
        float c[8], wv[8];
        load8(pool + v * 8, c);
        unpack8(reinterpret_cast<const uint4*>(nrm.w)[v], wv);
#pragma unroll
        for (int e = 0; e < 8; ++e) c[e] = wv[e] * (c[e] * r);
        reinterpret_cast<uint4*>(nrm.normed + t * s.d)[v] = pack8(c);
      }
      __syncthreads();  // red is rewritten by the next token
    }
    return;
  }
  if (!collapsed) return;  // the caller collapses (mhc_collapse_norm_fwd keeps the collapse in fp32)
  __syncthreads();
  for (int u = 0; u < kTokF; ++u) {
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

// Block per token: dX, dy (accumulated, or written when !accum: no zero-fill pass and no read of the old values;
// dy rounded to bf16 into dyb when given) elementwise; dpost, dcomb through a fixed-order block reduction.
// At most 128 registers, so two blocks (16 warps) share an SM: the kernel is bandwidth-bound.
__global__ void __launch_bounds__(kThreads, 2)
    expand_bwd_kernel(MhcDims s, const bf16* X, const bf16* y, const float* post, const float* comb,
                      const float* dXout, float* dX, float* dy, float* dpost, float* dcomb, bool accum, bf16* dyb) {
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
    float o[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (accum) load8(dy + t * s.d + v * 8, o);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float a = 0.f;
#pragma unroll
      for (int j = 0; j < kN; ++j) a = fmaf(ps[j], g[j][e], a);
      o[e] += a;
    }
    if (dyb)
      reinterpret_cast<uint4*>(dyb + t * s.d)[v] = pack8(o);
    else
      store8(dy + t * s.d + v * 8, o);
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (accum)
        load8(dX + t * D + i * s.d + v * 8, o);
      else
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = 0.f;
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

// Site backward, kTokB = 16 tokens per block. Warp w: tokens t0 + w and t0 + 8 + w in turn: the collapse dot
// products (or dpre), gate derivatives and Sinkhorn backward -> dz (pre-activation grads), dmix_s = dz * scale *
// rstd, corr. Then all threads: dX over the 4d columns, two adjacent columns per thread (4-byte X, 8-byte dcol
// and dX accesses), the two fn columns in registers reused by the block's 16 tokens (fn is read from L2
// once per 16 tokens) and each token's 24 dmix values read from shared memory as 6 broadcast float4s.
constexpr int kTokB = 16;
// The dX pass's columns are split over kColSplit grid rows (each redoing the cheap per-token phase), so a
// training-size N gives enough blocks for the tail of the last wave to stay short.
constexpr int kColSplit = 2;
__global__ void __launch_bounds__(kThreads)
    site_bwd_kernel(MhcDims s, const bf16* X, const float* fn, const float* base, const float* scale,
                    MhcActs a, const float* dcol, const float* dpost, const float* dcomb, float* dX,
                    float* dz_out, float* dmixs_out, const float* dpre) {
  __shared__ float hist[kThreads / 32][kMaxSteps * 16];
  __shared__ __align__(16) float dms[kTokB][kM];
  __shared__ float corr[kTokB], pres[kTokB][kN];
  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, li = lane % 16;
  const int64_t t0 = int64_t(blockIdx.x) * kTokB, D = kN * s.d;
  for (int q = 0; q < kTokB / (kThreads / 32); ++q) {
    const int u = q * (kThreads / 32) + w;
    const int64_t t = t0 + u;
    if (t >= s.n_tok) break;  // warp-uniform
    float dp[kN] = {0, 0, 0, 0};
    if (dpre) {  // dcol . X[i] from mhc_collapse_norm_bwd: on lane 0, the warp sum below broadcasts it
#pragma unroll
      for (int i = 0; i < kN; ++i) dp[i] = lane == 0 ? dpre[t * kN + i] : 0.f;
    } else {
      for (int64_t v = lane; v < s.d / 8; v += 32) {
        float g[8];
        load8(dcol + t * s.d + v * 8, g);
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          float xf[8];
          unpack8(reinterpret_cast<const uint4*>(X + t * D + i * s.d)[v], xf);
#pragma unroll
          for (int e = 0; e < 8; ++e) dp[i] = fmaf(g[e], xf[e], dp[i]);
        }
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
      pres[u][lane] = a.pre[t * kN + lane];
    } else if (lane < 2 * kN) {
      const float sp = sigm(scale[1] * mx[lane] + base[lane]);
      z = dpost[t * kN + lane - kN] * 2.f * sp * (1.f - sp);
    }
    const float zl = scale[2] * mx[2 * kN + li] + base[2 * kN + li];
    const float dl = sinkhorn_bwd_warp(zl, dcomb[t * 16 + li], s.sinkhorn_iters, s.hc_eps, hist[w]);
    __syncwarp();  // hist is rewritten for the warp's next token
    const float dl_k = __shfl_sync(0xffffffffu, dl, (lane - 2 * kN) & 15);
    if (lane >= 2 * kN) z = lane < kM ? dl_k : 0.f;
    const float r = a.rstd[t];
    const float dmix = lane < kM ? z * scale[scale_group(lane)] : 0.f;
    const float c = warp_sum(lane < kM ? dmix * mx[lane] : 0.f) * r * r / float(D);
    if (lane < kM) {
      dms[u][lane] = dmix * r;
      if (blockIdx.y == 0) dz_out[t * kM + lane] = z, dmixs_out[t * kM + lane] = dmix * r;
    }
    if (lane == 0) corr[u] = c;
  }
  __syncthreads();
  const int n_u = int(s.n_tok - t0 < kTokB ? s.n_tok - t0 : kTokB);
  // Block row y of the grid: columns [y D / kColSplit, (y + 1) D / kColSplit) (even bounds: D = 4d, d % 8 == 0).
  const int64_t j_lo = int64_t(blockIdx.y) * (D / kColSplit), j_hi = j_lo + D / kColSplit;
  for (int64_t j = j_lo + 2 * int64_t(tid); j < j_hi; j += 2 * kThreads) {  // d even: both columns in stream i
    float f0[kM], f1[kM];
#pragma unroll
    for (int k = 0; k < kM; ++k) f0[k] = fn[k * D + j], f1[k] = fn[k * D + j + 1];  // fn: 4-byte aligned only
    const int i = int(j / s.d);
    const int64_t e = j - int64_t(i) * s.d;
#pragma unroll 2
    for (int u = 0; u < n_u; ++u) {  // (unroll 4 measured slower: 0.84 vs 0.79 ms at N = 8192)
      const int64_t tu = t0 + u;
      const float2 g = *reinterpret_cast<const float2*>(dcol + tu * s.d + e);
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(X + tu * D + j));
      float2* o = reinterpret_cast<float2*>(dX + tu * D + j);
      float a0 = pres[u][i] * g.x - corr[u] * x.x, a1 = pres[u][i] * g.y - corr[u] * x.y;
      const float4* dm = reinterpret_cast<const float4*>(dms[u]);
#pragma unroll
      for (int q = 0; q < kM / 4; ++q) {
        const float4 m = dm[q];
        a0 = fmaf(m.x, f0[4 * q], a0), a1 = fmaf(m.x, f1[4 * q], a1);
        a0 = fmaf(m.y, f0[4 * q + 1], a0), a1 = fmaf(m.y, f1[4 * q + 1], a1);
        a0 = fmaf(m.z, f0[4 * q + 2], a0), a1 = fmaf(m.z, f1[4 * q + 2], a1);
        a0 = fmaf(m.w, f0[4 * q + 3], a0), a1 = fmaf(m.w, f1[4 * q + 3], a1);
      }
      float2 ov = *o;
      ov.x += a0, ov.y += a1;
      *o = ov;
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

__global__ void split_bf16_kernel(const float* src, int64_t rows, int64_t cols, int64_t ld, bf16* hi, bf16* lo) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const float v = src[i];
  const bf16 h = __float2bfloat16(v);
  hi[r * ld + c] = h;
  lo[r * ld + c] = __float2bfloat16(v - __bfloat162float(h));
}

__global__ void add_split_rows_kernel(float* dW, const float* S, int64_t KD) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= KD) return;
  dW[i] += S[i] + S[KD + i];
}

void check_dims(const MhcDims& s) {
  TREX_CHECK(s.d > 0 && s.d % 8 == 0, "mHC (CUDA): stream width d = {} must be a positive multiple of 8",
             s.d);
  TREX_CHECK(s.sinkhorn_iters >= 1 && s.sinkhorn_iters <= kMhcMaxSinkhornIters,
             "mHC (CUDA): hc_sinkhorn_iters = {} out of range 1..{}", s.sinkhorn_iters, kMhcMaxSinkhornIters);
}

unsigned token_blocks(int64_t n) {
  return unsigned((n + kTokF - 1) / kTokF);
}

}  // namespace

namespace {

void launch_site_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                     const MhcActs& a, bf16* collapsed, const SiteNorm& nrm, cudaStream_t stream) {
  const unsigned tb = token_blocks(s.n_tok);
  if (tb >= 33) {  // enough blocks to keep the GPU's loads in flight
    site_fwd_kernel<1><<<tb, kThreads, 0, stream>>>(s, X, fn, base, scale, a, collapsed, nrm);
    TREX_CUDA_LAUNCHED();
    return;
  }
  // Few tokens: clusters of blocks split each token block's projection (16 per cluster needs the non-portable
  // size, which Hopper allows; 4 when there are already tb >= 9 token blocks).
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  const int split = tb <= 8 ? 16 : 4;
  cfg.gridDim = dim3(tb * unsigned(split));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(split), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (split == 16) {
    int dev = 0;
    TREX_CUDA(cudaGetDevice(&dev));
    static bool allowed[64] = {};  // once per device (idempotent, so a race only repeats it)
    if (dev >= 64 || !allowed[dev]) {
      TREX_CUDA(cudaFuncSetAttribute(site_fwd_kernel<16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      if (dev < 64) allowed[dev] = true;
    }
    TREX_CUDA(cudaLaunchKernelEx(&cfg, site_fwd_kernel<16>, s, X, fn, base, scale, a, collapsed, nrm));
  } else {
    TREX_CUDA(cudaLaunchKernelEx(&cfg, site_fwd_kernel<4>, s, X, fn, base, scale, a, collapsed, nrm));
  }
  TREX_CUDA_LAUNCHED();
}

}  // namespace

void mhc_site_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, bf16* collapsed, cudaStream_t stream) {
  check_dims(s);
  if (s.n_tok == 0) return;
  launch_site_fwd(s, X, fn, base, scale, a, collapsed, SiteNorm{}, stream);
}

void mhc_site_norm_fwd_proj(const MhcDims& s, const bf16* X, const float* proj, const float* base,
                            const float* scale, const MhcActs& a, const bf16* norm_w, float norm_eps, bf16* normed,
                            float* norm_rstd, cudaStream_t stream) {
  check_dims(s);
  TREX_CHECK(mhc_site_norm_fwd_serves(s.d), "mhc_site_norm_fwd_proj (CUDA): d = {} above the {} the kernel stages",
             s.d, kNormMaxWidth);
  TREX_CHECK(proj && norm_w && normed && norm_rstd && reinterpret_cast<uintptr_t>(norm_w) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(normed) % 16 == 0,
             "mhc_site_norm_fwd_proj (CUDA): proj, norm weight and outputs are required, the bf16 ones 16-byte aligned");
  if (s.n_tok == 0) return;
  SiteNorm nrm{norm_w, normed, norm_rstd, norm_eps, proj};
  site_fwd_kernel<1><<<token_blocks(s.n_tok), kThreads, 0, stream>>>(s, X, nullptr, base, scale, a, nullptr, nrm);
  TREX_CUDA_LAUNCHED();
}

bool mhc_site_norm_fwd_serves(int64_t d) {
  return d % 8 == 0 && d <= kNormMaxWidth;
}

void mhc_site_norm_fwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                       const MhcActs& a, const bf16* norm_w, float norm_eps, bf16* normed, float* norm_rstd,
                       cudaStream_t stream) {
  check_dims(s);
  TREX_CHECK(mhc_site_norm_fwd_serves(s.d), "mhc_site_norm_fwd (CUDA): d = {} above the {} the kernel stages",
             s.d, kNormMaxWidth);
  TREX_CHECK(norm_w && normed && norm_rstd, "mhc_site_norm_fwd (CUDA): norm weight and outputs are required");
  TREX_CHECK(reinterpret_cast<uintptr_t>(norm_w) % 16 == 0 && reinterpret_cast<uintptr_t>(normed) % 16 == 0,
             "mhc_site_norm_fwd (CUDA): norm weight and normed must be 16-byte aligned (8-wide bf16 accesses)");
  if (s.n_tok == 0) return;
  launch_site_fwd(s, X, fn, base, scale, a, nullptr, SiteNorm{norm_w, normed, norm_rstd, norm_eps}, stream);
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
                    cudaStream_t stream, bool accumulate, bf16* dy_bf16) {
  check_dims(s);
  TREX_CHECK(!(accumulate && dy_bf16), "mhc_expand_bwd (CUDA): the bf16 dy output needs accumulate = false");
  if (s.n_tok == 0) return;
  expand_bwd_kernel<<<unsigned(s.n_tok), kThreads, 0, stream>>>(s, X, y, post, comb, dXout, dX, dy, dpost,
                                                                dcomb, accumulate, dy_bf16);
  TREX_CUDA_LAUNCHED();
}

void mhc_split_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, bf16* hi, bf16* lo,
                    cudaStream_t stream) {
  if (rows * cols == 0) return;
  split_bf16_kernel<<<unsigned((rows * cols + 255) / 256), 256, 0, stream>>>(src, rows, cols, ld, hi, lo);
  TREX_CUDA_LAUNCHED();
}

void mhc_add_split_rows(float* dW, const float* S, int64_t K, int64_t D, cudaStream_t stream) {
  if (K * D == 0) return;
  add_split_rows_kernel<<<unsigned((K * D + 255) / 256), 256, 0, stream>>>(dW, S, K * D);
  TREX_CUDA_LAUNCHED();
}

const float* mhc_site_bwd_dmix(const MhcDims& s, const float* scratch) {
  return scratch + s.n_tok * kM;
}

int64_t mhc_site_bwd_scratch(const MhcDims& s) {
  return 2 * s.n_tok * kM + token_weight_grad_scratch(s.n_tok, kM, kN * s.d);
}

void mhc_site_bwd(const MhcDims& s, const bf16* X, const float* fn, const float* base, const float* scale,
                  const MhcActs& a, const float* dcollapsed, const float* dpost, const float* dcomb, float* dX,
                  float* dfn, float* dbase, float* dscale, float* scratch, cudaStream_t stream,
                  const float* dpre) {
  check_dims(s);
  if (s.n_tok == 0) return;
  TREX_CHECK(reinterpret_cast<uintptr_t>(scratch) % 16 == 0 && reinterpret_cast<uintptr_t>(dcollapsed) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(dX) % 8 == 0,
             "mhc_site_bwd (CUDA): scratch and dcollapsed must be 16-byte aligned, dX 8-byte (vector accesses)");
  float* dz = scratch;
  float* dmixs = scratch + s.n_tok * kM;
  site_bwd_kernel<<<dim3(unsigned((s.n_tok + kTokB - 1) / kTokB), kColSplit), kThreads, 0, stream>>>(
      s, X, fn, base, scale, a, dcollapsed, dpost, dcomb, dX, dz, dmixs, dpre);
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
