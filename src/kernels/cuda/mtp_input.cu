#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mtp_input.h"

namespace trex::cuda {

namespace {

__global__ void embed_rows_fwd_kernel(bf16* out, const int32_t* ids, const bf16* table, int64_t d) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  bf16* o = out + t * d;
  if (id < 0) {
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) o[k] = __float2bfloat16(0.f);
    return;
  }
  const bf16* row = table + int64_t(id) * d;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) o[k] = row[k];
}

// One block per token t: the first token of each id (the lowest t) adds the rows of every token with that id to
// the id's table row, in token order; the other tokens' blocks return. No atomics, so the sum's rounding is the same
// in every run; each first token reads the ids after it once (staged through shared memory).
constexpr int kRowsThreads = 256;
__global__ void __launch_bounds__(kRowsThreads)
    embed_rows_bwd_kernel(float* dtable, const int32_t* ids, const bf16* drows, int64_t n, int64_t d) {
  __shared__ int32_t ids_s[kRowsThreads];
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0) return;  // uniform over the block
  bool earlier = false;
  for (int64_t k = threadIdx.x; k < t; k += kRowsThreads) earlier |= ids[k] == id;
  if (__syncthreads_or(earlier)) return;
  float* row = dtable + int64_t(id) * d;
  for (int64_t k0 = t; k0 < n; k0 += kRowsThreads) {
    __syncthreads();  // the previous chunk of ids is consumed
    if (k0 + threadIdx.x < n) ids_s[threadIdx.x] = ids[k0 + threadIdx.x];
    __syncthreads();
    const int m = int(min(int64_t(kRowsThreads), n - k0));
    for (int x = 0; x < m; ++x) {
      if (ids_s[x] != id) continue;
      const bf16* src = drows + (k0 + x) * d;
      for (int64_t k = threadIdx.x; k < d; k += kRowsThreads) row[k] += __bfloat162float(src[k]);
    }
  }
}

__global__ void sum_streams_kernel(bf16* out, const float* dX, int64_t hc, int64_t d) {
  const int64_t t = blockIdx.x;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < hc; ++j) acc += dX[(t * hc + j) * d + k];
    out[t * d + k] = __float2bfloat16(acc);
  }
}

}  // namespace

void embed_rows_masked_fwd(bf16* out, const int32_t* ids, const bf16* table, int64_t n, int64_t d, cudaStream_t s) {
  if (n == 0) return;
  embed_rows_fwd_kernel<<<unsigned(n), 256, 0, s>>>(out, ids, table, d);
  TREX_CUDA_LAUNCHED();
}

void embed_rows_masked_bwd(float* dtable, const int32_t* ids, const bf16* drows, int64_t n, int64_t d,
                           cudaStream_t s) {
  if (n == 0) return;
  embed_rows_bwd_kernel<<<unsigned(n), kRowsThreads, 0, s>>>(dtable, ids, drows, n, d);
  TREX_CUDA_LAUNCHED();
}

void sum_streams_f32_to_bf16(bf16* out, const float* dX, int64_t n, int64_t n_hc, int64_t d, cudaStream_t s) {
  if (n == 0) return;
  sum_streams_kernel<<<unsigned(n), 256, 0, s>>>(out, dX, n_hc, d);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
