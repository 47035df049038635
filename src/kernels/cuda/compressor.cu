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

// grid (E, ceil(c / 128)), 128 threads: one thread per (entry, channel).
__global__ void pool_fwd_kernel(bf16* pooled, const bf16* kv, const bf16* gate, const float* ape, CompressArgs a) {
  const int64_t e = blockIdx.x, ch = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (ch >= a.c) return;
  const int64_t stride = (a.overlap ? 2 : 1) * a.c;
  const int n = n_cands(a, e);
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const Cand q = cand(a, e, j);
    mx = fmaxf(mx, __bfloat162float(gate[q.tok * stride + q.off + ch]) + ape[q.ape_row * stride + q.off + ch]);
  }
  float sum = 0.f, acc = 0.f;
  for (int j = 0; j < n; ++j) {
    const Cand q = cand(a, e, j);
    const float w =
        __expf(__bfloat162float(gate[q.tok * stride + q.off + ch]) + ape[q.ape_row * stride + q.off + ch] - mx);
    sum += w;
    acc += w * __bfloat162float(kv[q.tok * stride + q.off + ch]);
  }
  pooled[e * a.c + ch] = __float2bfloat16(acc / sum);
}

__global__ void pool_bwd_kernel(bf16* dkv, bf16* dgate, const bf16* dpooled, const bf16* kv, const bf16* gate,
                                const float* ape, CompressArgs a) {
  const int64_t e = blockIdx.x, ch = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (ch >= a.c) return;
  const int64_t stride = (a.overlap ? 2 : 1) * a.c;
  const int n = n_cands(a, e);
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const Cand q = cand(a, e, j);
    mx = fmaxf(mx, __bfloat162float(gate[q.tok * stride + q.off + ch]) + ape[q.ape_row * stride + q.off + ch]);
  }
  float sum = 0.f, acc = 0.f;
  for (int j = 0; j < n; ++j) {
    const Cand q = cand(a, e, j);
    const float w =
        __expf(__bfloat162float(gate[q.tok * stride + q.off + ch]) + ape[q.ape_row * stride + q.off + ch] - mx);
    sum += w;
    acc += w * __bfloat162float(kv[q.tok * stride + q.off + ch]);
  }
  const float pooled = acc / sum, dp = __bfloat162float(dpooled[e * a.c + ch]);
  for (int j = 0; j < n; ++j) {
    const Cand q = cand(a, e, j);
    const int64_t idx = q.tok * stride + q.off + ch;
    const float w = __expf(__bfloat162float(gate[idx]) + ape[q.ape_row * stride + q.off + ch] - mx) / sum;
    dkv[idx] = __float2bfloat16(w * dp);
    dgate[idx] = __float2bfloat16(w * (__bfloat162float(kv[idx]) - pooled) * dp);
  }
}

// dape[j][k] += sum_e dgate[entry_first[e] + j][k]: every token of a complete window used ape[its offset] in
// both channel halves (previous-window candidates are the tokens of an earlier complete window).
__global__ void ape_grad_kernel(float* dape, const bf16* dgate, CompressArgs a) {
  const int64_t stride = (a.overlap ? 2 : 1) * a.c;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= a.ratio * stride) return;
  const int64_t j = i / stride, k = i % stride;
  float acc = 0.f;
  for (int64_t e = 0; e < a.n_entries; ++e) acc += __bfloat162float(dgate[(a.entry_first[e] + j) * stride + k]);
  dape[i] += acc;
}

}  // namespace

void compress_pool_fwd(bf16* pooled, const bf16* kv, const bf16* gate, const float* ape, const CompressArgs& a,
                       cudaStream_t s) {
  if (a.n_entries == 0) return;
  TREX_CHECK(a.ratio > 0 && a.c > 0, "compress_pool_fwd: ratio {} c {}", a.ratio, a.c);
  dim3 grid(unsigned(a.n_entries), unsigned((a.c + 127) / 128));
  pool_fwd_kernel<<<grid, 128, 0, s>>>(pooled, kv, gate, ape, a);
  TREX_CUDA_LAUNCHED();
}

void compress_pool_bwd(bf16* dkv, bf16* dgate, float* dape, const bf16* dpooled, const bf16* kv,
                       const bf16* gate, const float* ape, const CompressArgs& a, cudaStream_t s) {
  if (a.n_entries == 0) return;
  dim3 grid(unsigned(a.n_entries), unsigned((a.c + 127) / 128));
  pool_bwd_kernel<<<grid, 128, 0, s>>>(dkv, dgate, dpooled, kv, gate, ape, a);
  TREX_CUDA_LAUNCHED();
  if (dape) {
    const int64_t n = a.ratio * (a.overlap ? 2 : 1) * a.c;
    ape_grad_kernel<<<unsigned((n + 255) / 256), 256, 0, s>>>(dape, dgate, a);
    TREX_CUDA_LAUNCHED();
  }
}

}  // namespace trex::cuda
