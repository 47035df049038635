#include "kernels/cuda/compressor.h"
#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

namespace {

// Per (entry, channel): candidate j of 2m (own window: j < m; previous window: m <= j < 2m).
struct Cand {
  int64_t tok;
  int64_t off;  // channel offset inside the kv / gate row
  int64_t ape_row;
};

__device__ inline int n_cands(const CompressArgs& a, int64_t e) {
  return (a.overlap && a.entry_doc_index[e] > 0) ? int(2 * a.ratio) : int(a.ratio);
}
__device__ inline Cand cand(const CompressArgs& a, int64_t e, int j) {
  const int64_t first = a.entry_first[e];
  if (j < a.ratio) return {first + j, a.overlap ? a.c : 0, j};
  return {first - a.ratio + (j - a.ratio), 0, j - a.ratio};
}

// Block = (entry, 32 channels), kGroups warps: lane l owns channel 32 blockIdx.y + l, warp g the candidates
// j = g, g + kGroups, ... (an HCA entry has 128 of them: one thread per channel was a long serial loop on a
// grid of a few hundred blocks). The softmax is the two-pass one of the CPU code: the max over all candidates
// first (combined across the warps in shared memory), then the exponentials' sum and the weighted values.
constexpr int kGroups = 4;

struct PoolStats {  // per (entry, channel): max logit, sum of exp(logit - max), pooled value
  float mx, sum, pooled;
};

__device__ inline float logit_at(const CompressArgs& a, const bf16* gate, const float* ape, const Cand& q,
                                 int64_t stride, int64_t ch) {
  return __bfloat162float(gate[q.tok * stride + q.off + ch]) + ape[q.ape_row * stride + q.off + ch];
}

// All threads of the block call this (it synchronises); `live` = the thread's channel exists.
__device__ PoolStats pool_stats(const CompressArgs& a, const bf16* kv, const bf16* gate, const float* ape, int64_t e,
                                int64_t ch, bool live) {
  __shared__ float red[2][kGroups][32];
  const int lane = threadIdx.x % 32, g = threadIdx.x / 32;
  const int64_t stride = (a.overlap ? 2 : 1) * a.c;
  const int n = n_cands(a, e);
  float mx = -INFINITY;
  if (live)
    for (int j = g; j < n; j += kGroups) mx = fmaxf(mx, logit_at(a, gate, ape, cand(a, e, j), stride, ch));
  red[0][g][lane] = mx;
  __syncthreads();
  mx = red[0][0][lane];
#pragma unroll
  for (int u = 1; u < kGroups; ++u) mx = fmaxf(mx, red[0][u][lane]);
  __syncthreads();
  float sum = 0.f, acc = 0.f;
  if (live)
    for (int j = g; j < n; j += kGroups) {
      const Cand q = cand(a, e, j);
      const float w = __expf(logit_at(a, gate, ape, q, stride, ch) - mx);
      sum += w;
      acc += w * __bfloat162float(kv[q.tok * stride + q.off + ch]);
    }
  red[0][g][lane] = sum;
  red[1][g][lane] = acc;
  __syncthreads();
  sum = 0.f, acc = 0.f;
#pragma unroll
  for (int u = 0; u < kGroups; ++u) sum += red[0][u][lane], acc += red[1][u][lane];  // fixed order
  return {mx, sum, acc / sum};
}

// grid (E, ceil(c / 32)), 32 * kGroups threads.
__global__ void __launch_bounds__(32 * kGroups)
    pool_fwd_kernel(bf16* pooled, const bf16* kv, const bf16* gate, const float* ape, CompressArgs a) {
  const int64_t e = blockIdx.x, ch = int64_t(blockIdx.y) * 32 + threadIdx.x % 32;
  const bool live = ch < a.c;
  const PoolStats st = pool_stats(a, kv, gate, ape, e, ch, live);
  if (live && threadIdx.x < 32) pooled[e * a.c + ch] = __float2bfloat16(st.pooled);
}

__global__ void __launch_bounds__(32 * kGroups)
    pool_bwd_kernel(bf16* dkv, bf16* dgate, const bf16* dpooled, const bf16* kv, const bf16* gate,
                    const float* ape, CompressArgs a) {
  const int64_t e = blockIdx.x, ch = int64_t(blockIdx.y) * 32 + threadIdx.x % 32;
  const bool live = ch < a.c;
  const PoolStats st = pool_stats(a, kv, gate, ape, e, ch, live);
  if (!live) return;
  const int64_t stride = (a.overlap ? 2 : 1) * a.c;
  const int n = n_cands(a, e);
  const float dp = __bfloat162float(dpooled[e * a.c + ch]);
  for (int j = threadIdx.x / 32; j < n; j += kGroups) {
    const Cand q = cand(a, e, j);
    const int64_t idx = q.tok * stride + q.off + ch;
    const float w = __expf(__bfloat162float(gate[idx]) + ape[q.ape_row * stride + q.off + ch] - st.mx) / st.sum;
    dkv[idx] = __float2bfloat16(w * dp);
    dgate[idx] = __float2bfloat16(w * (__bfloat162float(kv[idx]) - st.pooled) * dp);
  }
}

// dape[j][k] += sum_e dgate[entry_first[e] + j][k]: every token of a complete window used ape[its offset] in
// both channel halves (previous-window candidates are the tokens of an earlier complete window). Two passes, so
// the many-entry case (CSA: thousands of entries, few columns) is not one long serial loop per column: slice s of
// kApeSlice entries -> partial[s][i], then the slices summed in order (deterministic).
constexpr int64_t kApeSlice = 32;

__global__ void ape_partial_kernel(float* partial, const bf16* dgate, CompressArgs a) {
  const int64_t stride = (a.overlap ? 2 : 1) * a.c, n = a.ratio * stride;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t j = i / stride, k = i % stride;
  const int64_t e0 = int64_t(blockIdx.y) * kApeSlice, e1 = min(a.n_entries, e0 + kApeSlice);
  float acc = 0.f;
  for (int64_t e = e0; e < e1; ++e) acc += __bfloat162float(dgate[(a.entry_first[e] + j) * stride + k]);
  partial[int64_t(blockIdx.y) * n + i] = acc;
}

__global__ void ape_sum_kernel(float* dape, const float* partial, int64_t n, int64_t slices) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int64_t s = 0; s < slices; ++s) acc += partial[s * n + i];
  dape[i] += acc;
}

}  // namespace

void compress_pool_fwd(bf16* pooled, const bf16* kv, const bf16* gate, const float* ape, const CompressArgs& a,
                       cudaStream_t s) {
  if (a.n_entries == 0) return;
  TREX_CHECK(a.ratio > 0 && a.c > 0, "compress_pool_fwd: ratio {} c {}", a.ratio, a.c);
  dim3 grid(unsigned(a.n_entries), unsigned((a.c + 31) / 32));
  pool_fwd_kernel<<<grid, 32 * kGroups, 0, s>>>(pooled, kv, gate, ape, a);
  TREX_CUDA_LAUNCHED();
}

size_t compress_pool_bwd_scratch_bytes(const CompressArgs& a) {
  const int64_t n = a.ratio * (a.overlap ? 2 : 1) * a.c, slices = (a.n_entries + kApeSlice - 1) / kApeSlice;
  return size_t(slices * n) * sizeof(float);
}

void compress_pool_bwd(bf16* dkv, bf16* dgate, float* dape, const bf16* dpooled, const bf16* kv,
                       const bf16* gate, const float* ape, const CompressArgs& a, cudaStream_t s,
                       float* ape_scratch) {
  if (a.n_entries == 0) return;
  dim3 grid(unsigned(a.n_entries), unsigned((a.c + 31) / 32));
  pool_bwd_kernel<<<grid, 32 * kGroups, 0, s>>>(dkv, dgate, dpooled, kv, gate, ape, a);
  TREX_CUDA_LAUNCHED();
  if (dape) {
    const int64_t n = a.ratio * (a.overlap ? 2 : 1) * a.c, slices = (a.n_entries + kApeSlice - 1) / kApeSlice;
    TREX_CHECK(slices <= 65535, "compress_pool_bwd: {} entries exceed the ape-gradient grid", a.n_entries);
    float* partial = ape_scratch;
    if (!ape_scratch) TREX_CUDA(cudaMallocAsync(&partial, compress_pool_bwd_scratch_bytes(a), s));
    ape_partial_kernel<<<dim3(unsigned((n + 255) / 256), unsigned(slices)), 256, 0, s>>>(partial, dgate, a);
    TREX_CUDA_LAUNCHED();
    ape_sum_kernel<<<unsigned((n + 255) / 256), 256, 0, s>>>(dape, partial, n, slices);
    TREX_CUDA_LAUNCHED();
    if (!ape_scratch) TREX_CUDA(cudaFreeAsync(partial, s));
  }
}

}  // namespace trex::cuda
