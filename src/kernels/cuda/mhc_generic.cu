// Generic mHC / hc_head (see mhc_generic.h): one thread per token, the CPU reference's per-token math
// (src/model/dsv4/mhc.cpp) in fp32; parameter gradients reduced over tokens in token order.
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mhc_generic.h"

namespace trex::cuda {

namespace {

constexpr int kMaxN = kMhcGenericMaxStreams;
constexpr int kMaxNN = kMaxN * kMaxN;
constexpr int kMaxM = (2 + kMaxN) * kMaxN;
constexpr int kMaxSteps = 2 * kMhcMaxSinkhornIters - 1;
constexpr int kThreads = 128;

unsigned blocks(int64_t n) {
  return unsigned((n + kThreads - 1) / kThreads);
}

__device__ float sigm(float x) {
  return 1.f / (1.f + expf(-x));
}

// rstd of the flattened token x [D] and mix[k] = (fn[k] . x) * rstd for k < M.
__device__ float mix_proj(const bf16* x, const float* fn, int64_t D, int M, float eps, float* mix) {
  float ss = 0.f;
  for (int64_t j = 0; j < D; ++j) {
    const float v = __bfloat162float(x[j]);
    ss += v * v;
  }
  const float r = rsqrtf(ss / float(D) + eps);
  for (int k = 0; k < M; ++k) {
    float acc = 0.f;
    for (int64_t j = 0; j < D; ++j) acc += fn[k * D + j] * __bfloat162float(x[j]);
    mix[k] = acc * r;
  }
  return r;
}

// dX[j] += sum_k dmix_k fn[k, j] * rstd - corr * x[j] (mix_proj's backward for one token); dmix is scaled by
// rstd in place (what the fn gradient needs).
__device__ void mix_proj_bwd(const bf16* x, const float* fn, const float* mix, float rstd, float* dmix,
                             int64_t D, int M, float* dx) {
  float c = 0.f;
  for (int k = 0; k < M; ++k) c += dmix[k] * mix[k];
  const float corr = c * rstd * rstd / float(D);
  for (int k = 0; k < M; ++k) dmix[k] *= rstd;
  for (int64_t j = 0; j < D; ++j) {
    float acc = 0.f;
    for (int k = 0; k < M; ++k) acc += dmix[k] * fn[k * D + j];
    dx[j] += acc - corr * __bfloat162float(x[j]);
  }
}

// x / (sum + eps) along rows (axis 1) or columns (axis 0) of an n x n matrix, in place.
__device__ void normalise(float* m, int n, int axis, float eps) {
  for (int a = 0; a < n; ++a) {
    float s = 0.f;
    for (int b = 0; b < n; ++b) s += axis == 1 ? m[a * n + b] : m[b * n + a];
    const float inv = 1.f / (s + eps);
    for (int b = 0; b < n; ++b) (axis == 1 ? m[a * n + b] : m[b * n + a]) *= inv;
  }
}

__device__ void normalise_bwd(const float* m, float* dy, int n, int axis, float eps) {
  for (int a = 0; a < n; ++a) {
    float s = 0.f;
    for (int b = 0; b < n; ++b) s += axis == 1 ? m[a * n + b] : m[b * n + a];
    const float inv = 1.f / (s + eps);
    float dot = 0.f;
    for (int b = 0; b < n; ++b) {
      const int i = axis == 1 ? a * n + b : b * n + a;
      dot += dy[i] * m[i] * inv;
    }
    for (int b = 0; b < n; ++b) {
      const int i = axis == 1 ? a * n + b : b * n + a;
      dy[i] = (dy[i] - dot) * inv;
    }
  }
}

__device__ void row_softmax(const float* z, int n, float* p) {
  for (int i = 0; i < n; ++i) {
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) mx = fmaxf(mx, z[i * n + j]);
    float s = 0.f;
    for (int j = 0; j < n; ++j) s += expf(z[i * n + j] - mx);
    for (int j = 0; j < n; ++j) p[i * n + j] = expf(z[i * n + j] - mx) / s;
  }
}

// Row softmax, + eps, column normalisation, then (iters - 1) x (row, column).
__device__ void sinkhorn_fwd(const float* logits, int n, int iters, float eps, float* out) {
  row_softmax(logits, n, out);
  for (int i = 0; i < n * n; ++i) out[i] += eps;
  normalise(out, n, 0, eps);
  for (int it = 1; it < iters; ++it) {
    normalise(out, n, 1, eps);
    normalise(out, n, 0, eps);
  }
}

// dlogits (written) from dout, recomputing the forward normalisations (their inputs kept in local memory).
__device__ void sinkhorn_bwd(const float* logits, int n, int iters, float eps, const float* dout,
                             float* dlogits) {
  const int nn = n * n, steps = 2 * iters - 1;
  float inputs[kMaxSteps * kMaxNN], p[kMaxNN], cur[kMaxNN], g[kMaxNN];
  row_softmax(logits, n, p);
  for (int i = 0; i < nn; ++i) cur[i] = p[i] + eps;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < nn; ++i) inputs[s * nn + i] = cur[i];
    normalise(cur, n, s % 2 == 0 ? 0 : 1, eps);
  }
  for (int i = 0; i < nn; ++i) g[i] = dout[i];
  for (int s = steps - 1; s >= 0; --s) normalise_bwd(inputs + s * nn, g, n, s % 2 == 0 ? 0 : 1, eps);
  for (int i = 0; i < n; ++i) {
    float dot = 0.f;
    for (int j = 0; j < n; ++j) dot += g[i * n + j] * p[i * n + j];
    for (int j = 0; j < n; ++j) dlogits[i * n + j] = p[i * n + j] * (g[i * n + j] - dot);
  }
}

__global__ void site_fwd_kernel(MhcDims s, int n, const bf16* X, const float* fn, const float* base,
                                const float* scale, MhcActs a, bf16* collapsed) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= s.n_tok) return;
  const int M = (2 + n) * n;
  const int64_t d = s.d, D = n * d;
  const bf16* x = X + t * D;
  float* mx = a.mix + t * M;
  a.rstd[t] = mix_proj(x, fn, D, M, s.rms_eps, mx);
  float* pre = a.pre + t * n;
  float* post = a.post + t * n;
  for (int i = 0; i < n; ++i) {
    pre[i] = sigm(scale[0] * mx[i] + base[i]) + s.hc_eps;
    post[i] = 2.f * sigm(scale[1] * mx[n + i] + base[n + i]);
  }
  float logits[kMaxNN];
  for (int k = 0; k < n * n; ++k) logits[k] = scale[2] * mx[2 * n + k] + base[2 * n + k];
  sinkhorn_fwd(logits, n, s.sinkhorn_iters, s.hc_eps, a.comb + t * n * n);
  if (!collapsed) return;  // the caller collapses in fp32 (mhc_norm.h)
  for (int64_t e = 0; e < d; ++e) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) acc += pre[i] * __bfloat162float(x[i * d + e]);
    collapsed[t * d + e] = __float2bfloat16(acc);
  }
}

__global__ void expand_fwd_kernel(MhcDims s, int n, const bf16* X, const bf16* y, const float* post,
                                  const float* comb, bf16* Xout) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= s.n_tok) return;
  const int64_t d = s.d;
  const bf16* x = X + t * n * d;
  const float* c = comb + t * n * n;
  for (int j = 0; j < n; ++j)
    for (int64_t e = 0; e < d; ++e) {
      float acc = post[t * n + j] * __bfloat162float(y[t * d + e]);
      for (int i = 0; i < n; ++i) acc += c[i * n + j] * __bfloat162float(x[i * d + e]);
      Xout[t * n * d + j * d + e] = __float2bfloat16(acc);
    }
}

__global__ void expand_bwd_kernel(MhcDims s, int n, const bf16* X, const bf16* y, const float* post,
                                  const float* comb, const float* dXout, float* dX, float* dy, float* dpost,
                                  float* dcomb, bool accum, bf16* dyb) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= s.n_tok) return;
  const int64_t d = s.d;
  const bf16* x = X + t * n * d;
  const float* c = comb + t * n * n;
  const float* g = dXout + t * n * d;
  for (int j = 0; j < n; ++j) {
    float dp = 0.f;
    for (int64_t e = 0; e < d; ++e) dp += g[j * d + e] * __bfloat162float(y[t * d + e]);
    dpost[t * n + j] = dp;
    for (int i = 0; i < n; ++i) {
      float dc = 0.f;
      for (int64_t e = 0; e < d; ++e) dc += g[j * d + e] * __bfloat162float(x[i * d + e]);
      dcomb[t * n * n + i * n + j] = dc;
    }
  }
  for (int64_t e = 0; e < d; ++e) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc += post[t * n + j] * g[j * d + e];
    if (dyb)
      dyb[t * d + e] = __float2bfloat16(acc);
    else
      dy[t * d + e] = accum ? dy[t * d + e] + acc : acc;
  }
  for (int i = 0; i < n; ++i)
    for (int64_t e = 0; e < d; ++e) {
      float acc = 0.f;
      for (int j = 0; j < n; ++j) acc += c[i * n + j] * g[j * d + e];
      float* o = dX + t * n * d + i * d + e;
      *o = accum ? *o + acc : acc;
    }
}

// Per token: collapse backward, gates and Sinkhorn backward -> dz [N, M] (d pre-activation), then the mix
// projection's backward into dX; dmix [N, M] (scaled by rstd) kept for the fn gradient.
__global__ void site_bwd_kernel(MhcDims s, int n, const bf16* X, const float* fn, const float* base,
                                const float* scale, MhcActs a, const float* dcollapsed, const float* dpost,
                                const float* dcomb, float* dX, float* dz_out, float* dmix_out) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= s.n_tok) return;
  const int M = (2 + n) * n;
  const int64_t d = s.d, D = n * d;
  const bf16* x = X + t * D;
  const float* g = dcollapsed + t * d;
  const float* mx = a.mix + t * M;
  float* dx = dX + t * D;
  float z[kMaxM];
  for (int i = 0; i < n; ++i) {
    float dp = 0.f;
    const float p = a.pre[t * n + i];
    for (int64_t e = 0; e < d; ++e) {
      const float ge = g[e];
      dp += ge * __bfloat162float(x[i * d + e]);
      dx[i * d + e] += p * ge;
    }
    const float sg = sigm(scale[0] * mx[i] + base[i]);
    z[i] = dp * sg * (1.f - sg);
    const float sp = sigm(scale[1] * mx[n + i] + base[n + i]);
    z[n + i] = dpost[t * n + i] * 2.f * sp * (1.f - sp);
  }
  float logits[kMaxNN];
  for (int k = 0; k < n * n; ++k) logits[k] = scale[2] * mx[2 * n + k] + base[2 * n + k];
  sinkhorn_bwd(logits, n, s.sinkhorn_iters, s.hc_eps, dcomb + t * n * n, z + 2 * n);
  float dmix[kMaxM];
  for (int k = 0; k < M; ++k) {
    dz_out[t * M + k] = z[k];
    dmix[k] = z[k] * scale[k < n ? 0 : (k < 2 * n ? 1 : 2)];
  }
  mix_proj_bwd(x, fn, mx, a.rstd[t], dmix, D, M, dx);
  for (int k = 0; k < M; ++k) dmix_out[t * M + k] = dmix[k];
}

// dfn[k, j] += sum_t dmix[t, k] x[t, j], tokens in order.
__global__ void dfn_kernel(float* dfn, const float* dmix, const bf16* X, int64_t N, int M, int64_t D) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= M * D) return;
  const int64_t k = idx / D, j = idx % D;
  float acc = 0.f;
  for (int64_t t = 0; t < N; ++t) acc += dmix[t * M + k] * __bfloat162float(X[t * D + j]);
  dfn[idx] += acc;
}

// dbase[k] += sum_t dz[t, k]; dscale[group(k)] += sum_t dz[t, k] mix[t, k], groups by k (site: pre / post /
// comb = 0 / 1 / 2; head: all 0). One block of M threads, fixed order.
__global__ void base_scale_kernel(float* dbase, float* dscale, const float* dz, const float* mix, int64_t N,
                                  int M, int n, bool site) {
  __shared__ float ds[kMaxM];
  const int k = threadIdx.x;
  if (k < M) {
    float db = 0.f, dsk = 0.f;
    for (int64_t t = 0; t < N; ++t) {
      db += dz[t * M + k];
      dsk += dz[t * M + k] * mix[t * M + k];
    }
    if (dbase) dbase[k] += db;
    ds[k] = dsk;
  }
  __syncthreads();
  if (threadIdx.x == 0 && dscale) {
    float g[3] = {0.f, 0.f, 0.f};
    for (int j = 0; j < M; ++j) g[site ? (j < n ? 0 : (j < 2 * n ? 1 : 2)) : 0] += ds[j];
    for (int q = 0; q < (site ? 3 : 1); ++q) dscale[q] += g[q];
  }
}

__global__ void head_fwd_kernel(int n, bf16* y, float* mix, float* rstd, float* w, const bf16* X,
                                const float* fn, const float* base, const float* scale, int64_t N, int64_t d,
                                float hc_eps, float rms_eps) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const int64_t D = n * d;
  const bf16* x = X + t * D;
  rstd[t] = mix_proj(x, fn, D, n, rms_eps, mix + t * n);
  for (int i = 0; i < n; ++i) w[t * n + i] = sigm(scale[0] * mix[t * n + i] + base[i]) + hc_eps;
  if (!y) return;  // the caller collapses in fp32 (mhc_norm.h)
  for (int64_t e = 0; e < d; ++e) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) acc += w[t * n + i] * __bfloat162float(x[i * d + e]);
    y[t * d + e] = __float2bfloat16(acc);
  }
}

__global__ void head_bwd_kernel(int n, float* dX, const float* dy, const bf16* X, const float* fn,
                                const float* base, const float* scale, const float* mix, const float* rstd,
                                const float* w, int64_t N, int64_t d, float* dz_out, float* dmix_out, bool accum) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const int64_t D = n * d;
  const bf16* x = X + t * D;
  const float* g = dy + t * d;
  float* dx = dX + t * D;
  if (!accum)
    for (int64_t j = 0; j < D; ++j) dx[j] = 0.f;  // the writing form: this token's row starts from 0
  float dmix[kMaxN];
  for (int i = 0; i < n; ++i) {
    float dw = 0.f;
    for (int64_t e = 0; e < d; ++e) {
      const float ge = g[e];
      dw += ge * __bfloat162float(x[i * d + e]);
      dx[i * d + e] += w[t * n + i] * ge;
    }
    const float sg = sigm(scale[0] * mix[t * n + i] + base[i]);
    const float z = dw * sg * (1.f - sg);
    dz_out[t * n + i] = z;
    dmix[i] = z * scale[0];
  }
  mix_proj_bwd(x, fn, mix + t * n, rstd[t], dmix, D, n, dx);
  for (int i = 0; i < n; ++i) dmix_out[t * n + i] = dmix[i];
}

void check(const char* what, int64_t n_hc, int64_t N, int64_t d) {
  TREX_CHECK(n_hc >= 1 && n_hc <= kMhcGenericMaxStreams, "{}: {} streams, the generic kernels serve 1..{}",
             what, n_hc, kMhcGenericMaxStreams);
  TREX_CHECK(N >= 0 && d > 0, "{}: N {} d {}", what, N, d);
}

}  // namespace

void mhc_site_fwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const float* fn, const float* base,
                          const float* scale, const MhcActs& a, bf16* collapsed, cudaStream_t stream) {
  check("mhc_site_fwd_generic", n_hc, s.n_tok, s.d);
  TREX_CHECK(s.sinkhorn_iters >= 1 && s.sinkhorn_iters <= kMhcMaxSinkhornIters,
             "mHC (CUDA, generic): hc_sinkhorn_iters = {} out of range 1..{}", s.sinkhorn_iters,
             kMhcMaxSinkhornIters);
  if (s.n_tok == 0) return;
  site_fwd_kernel<<<blocks(s.n_tok), kThreads, 0, stream>>>(s, int(n_hc), X, fn, base, scale, a, collapsed);
  TREX_CUDA_LAUNCHED();
}

void mhc_expand_fwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const bf16* y, const float* post,
                            const float* comb, bf16* Xout, cudaStream_t stream) {
  check("mhc_expand_fwd_generic", n_hc, s.n_tok, s.d);
  if (s.n_tok == 0) return;
  expand_fwd_kernel<<<blocks(s.n_tok), kThreads, 0, stream>>>(s, int(n_hc), X, y, post, comb, Xout);
  TREX_CUDA_LAUNCHED();
}

void mhc_expand_bwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const bf16* y, const float* post,
                            const float* comb, const float* dXout, float* dX, float* dy, float* dpost,
                            float* dcomb, cudaStream_t stream, bool accumulate, bf16* dy_bf16) {
  check("mhc_expand_bwd_generic", n_hc, s.n_tok, s.d);
  TREX_CHECK(!(accumulate && dy_bf16), "mhc_expand_bwd_generic: the bf16 dy output needs accumulate = false");
  if (s.n_tok == 0) return;
  expand_bwd_kernel<<<blocks(s.n_tok), kThreads, 0, stream>>>(s, int(n_hc), X, y, post, comb, dXout, dX, dy,
                                                              dpost, dcomb, accumulate, dy_bf16);
  TREX_CUDA_LAUNCHED();
}

int64_t mhc_site_bwd_generic_scratch(const MhcDims& s, int64_t n_hc) {
  return 2 * s.n_tok * (2 + n_hc) * n_hc;
}

void mhc_site_bwd_generic(const MhcDims& s, int64_t n_hc, const bf16* X, const float* fn, const float* base,
                          const float* scale, const MhcActs& a, const float* dcollapsed, const float* dpost,
                          const float* dcomb, float* dX, float* dfn, float* dbase, float* dscale,
                          float* scratch, cudaStream_t stream) {
  check("mhc_site_bwd_generic", n_hc, s.n_tok, s.d);
  TREX_CHECK(s.sinkhorn_iters >= 1 && s.sinkhorn_iters <= kMhcMaxSinkhornIters,
             "mHC (CUDA, generic): hc_sinkhorn_iters = {} out of range 1..{}", s.sinkhorn_iters,
             kMhcMaxSinkhornIters);
  if (s.n_tok == 0) return;
  const int n = int(n_hc), M = (2 + n) * n;
  const int64_t D = n_hc * s.d;
  float* dz = scratch;
  float* dmix = scratch + s.n_tok * M;
  site_bwd_kernel<<<blocks(s.n_tok), kThreads, 0, stream>>>(s, n, X, fn, base, scale, a, dcollapsed, dpost,
                                                            dcomb, dX, dz, dmix);
  TREX_CUDA_LAUNCHED();
  if (dfn) {
    dfn_kernel<<<blocks(M * D), kThreads, 0, stream>>>(dfn, dmix, X, s.n_tok, M, D);
    TREX_CUDA_LAUNCHED();
  }
  if (dbase || dscale) {
    base_scale_kernel<<<1, kMaxM, 0, stream>>>(dbase, dscale, dz, a.mix, s.n_tok, M, n, true);
    TREX_CUDA_LAUNCHED();
  }
}

void hc_head_fwd_generic(int64_t n_hc, bf16* y, float* mix, float* rstd, float* w, const bf16* X,
                         const float* fn, const float* base, const float* scale, int64_t N, int64_t d,
                         float hc_eps, float rms_eps, cudaStream_t s) {
  check("hc_head_fwd_generic", n_hc, N, d);
  if (N == 0) return;
  head_fwd_kernel<<<blocks(N), kThreads, 0, s>>>(int(n_hc), y, mix, rstd, w, X, fn, base, scale, N, d, hc_eps,
                                                 rms_eps);
  TREX_CUDA_LAUNCHED();
}

void hc_head_bwd_generic(int64_t n_hc, float* dX, float* dfn, float* dbase, float* dscale, const float* dy,
                         const bf16* X, const float* fn, const float* base, const float* scale,
                         const float* mix, const float* rstd, const float* w, int64_t N, int64_t d,
                         float* scratch, cudaStream_t s, bool accumulate) {
  check("hc_head_bwd_generic", n_hc, N, d);
  if (N == 0) return;
  const int n = int(n_hc);
  float* dz = scratch;
  float* dmix = scratch + N * n;
  head_bwd_kernel<<<blocks(N), kThreads, 0, s>>>(n, dX, dy, X, fn, base, scale, mix, rstd, w, N, d, dz, dmix,
                                                 accumulate);
  TREX_CUDA_LAUNCHED();
  if (dfn) {
    dfn_kernel<<<blocks(n * n_hc * d), kThreads, 0, s>>>(dfn, dmix, X, N, n, n_hc * d);
    TREX_CUDA_LAUNCHED();
  }
  if (dbase || dscale) {
    base_scale_kernel<<<1, kMaxM, 0, s>>>(dbase, dscale, dz, mix, N, n, n, false);
    TREX_CUDA_LAUNCHED();
  }
}

}  // namespace trex::cuda
