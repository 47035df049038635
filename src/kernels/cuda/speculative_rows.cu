#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/speculative_rows.h"

namespace trex::cuda {

namespace {

__global__ void copy_rows_kernel(bf16* dst, const int32_t* dst_idx, const bf16* a, const bf16* b,
                                 const int32_t* src_idx, int64_t width) {
  const int64_t i = blockIdx.x;
  const int32_t si = src_idx[i];
  const bf16* src = si >= 0 ? a + int64_t(si) * width : b + int64_t(-si - 1) * width;
  bf16* out = dst + (dst_idx ? int64_t(dst_idx[i]) : i) * width;
  const int64_t vec = width / 8;
  const uint4* s4 = reinterpret_cast<const uint4*>(src);
  uint4* d4 = reinterpret_cast<uint4*>(out);
  for (int64_t k = threadIdx.x; k < vec; k += blockDim.x) d4[k] = s4[k];
}

__global__ void resolve_ids_kernel(int32_t* out, const int32_t* code, const int32_t* picked, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int32_t c = code[i];
  out[i] = c >= 0 ? c : picked[-c - 1];
}

__global__ void add_streams_kernel(bf16* X, const bf16* e, int64_t hc, int64_t d) {
  const int64_t t = blockIdx.x;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    const float v = __bfloat162float(e[t * d + k]);
    for (int64_t j = 0; j < hc; ++j) {
      bf16& x = X[(t * hc + j) * d + k];
      x = __float2bfloat16(__bfloat162float(x) + v);
    }
  }
}

}  // namespace

void copy_rows_bf16(bf16* dst, const int32_t* dst_idx, const bf16* a, const bf16* b, const int32_t* src_idx,
                    int64_t n, int64_t width, cudaStream_t s) {
  if (n == 0) return;
  TREX_CHECK(width % 8 == 0, "copy_rows_bf16: width {} is not a multiple of 8", width);
  copy_rows_kernel<<<unsigned(n), 128, 0, s>>>(dst, dst_idx, a, b, src_idx, width);
  TREX_CUDA_LAUNCHED();
}

void resolve_token_ids(int32_t* out, const int32_t* code, const int32_t* picked, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  resolve_ids_kernel<<<unsigned((n + 127) / 128), 128, 0, s>>>(out, code, picked, n);
  TREX_CUDA_LAUNCHED();
}

void add_to_streams_bf16(bf16* X, const bf16* e, int64_t n, int64_t hc, int64_t d, cudaStream_t s) {
  if (n == 0) return;
  add_streams_kernel<<<unsigned(n), 256, 0, s>>>(X, e, hc, d);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
