#include "kernels/cuda/tensor_ops.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace trex::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 64 ? (b > 0 ? b : 1) : 65535 * 64);
}

__global__ void cast_f32_bf16_kernel(bf16* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}
__global__ void cast_bf16_f32_kernel(float* y, const bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}
__global__ void add_f32_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}
__global__ void add_bf16_f32_kernel(float* y, const bf16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += __bfloat162float(x[i]);
}
__global__ void scale_f32_kernel(float* y, float a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] *= a;
}
// Partial sums of squares: block b covers elements b*blockDim + j + k*gridDim*blockDim; a fixed-shape tree in
// shared memory (deterministic for a given n).
__global__ void sum_squares_partial_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double red[256];
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    acc += double(x[i]) * double(x[i]);
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}
__global__ void sum_partials_kernel(const double* partial, int n, double* out) {
  __shared__ double red[256];
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = red[0];
}
__global__ void permute_kernel(bf16* out, const bf16* in, int64_t N, int64_t G, int64_t X, bool to_gm) {
  const int64_t total = N * G * X;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    // i indexes the [N, G, X] layout.
    const int64_t x = i % X, g = (i / X) % G, t = i / (X * G);
    const int64_t j = (g * N + t) * X + x;
    if (to_gm)
      out[j] = in[i];
    else
      out[i] = in[j];
  }
}
// 16-byte chunks (X % 8 == 0, aligned pointers), 32-bit indices (n < 2^31 - grid): the projection-sized
// permutations are bandwidth-bound, the scalar kernel above is not.
__global__ void permute8_kernel(uint4* out, const uint4* in, uint32_t N, uint32_t G, uint32_t X8, bool to_gm) {
  const uint32_t total = N * G * X8;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const uint32_t x = i % X8, tg = i / X8, g = tg % G, t = tg / G;
    const int64_t j = (int64_t(g) * N + t) * X8 + x;
    if (to_gm)
      out[j] = in[i];
    else
      out[i] = in[j];
  }
}
__global__ void embed_fwd_kernel(bf16* X, const int32_t* ids, const bf16* table, int64_t d, int64_t n_hc) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + int64_t(ids[t]) * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const bf16 v = row[j];
    for (int64_t i = 0; i < n_hc; ++i) X[(t * n_hc + i) * d + j] = v;
  }
}
__global__ void embed_bwd_kernel(float* dtable, const int32_t* ids, const int32_t* order, const int32_t* seg,
                                 const float* dX, int64_t d, int64_t n_hc) {
  const int32_t b = seg[blockIdx.x], e = seg[blockIdx.x + 1];
  float* row = dtable + int64_t(ids[order[b]]) * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.f;
    for (int32_t k = b; k < e; ++k) {
      const int64_t t = order[k];
      for (int64_t i = 0; i < n_hc; ++i) acc += dX[(t * n_hc + i) * d + j];
    }
    row[j] += acc;
  }
}

}  // namespace

void cast_f32_to_bf16(bf16* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  cast_f32_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
  TREX_CUDA_LAUNCHED();
}
void cast_bf16_to_f32(float* y, const bf16* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  cast_bf16_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
  TREX_CUDA_LAUNCHED();
}
void add_f32(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
  TREX_CUDA_LAUNCHED();
}
void add_bf16_to_f32(float* y, const bf16* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_bf16_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
  TREX_CUDA_LAUNCHED();
}
void scale_f32(float* y, float a, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  scale_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(y, a, n);
  TREX_CUDA_LAUNCHED();
}
void sum_squares_f32(const float* x, int64_t n, double* scratch, cudaStream_t s) {
  sum_squares_partial_kernel<<<kSumSquaresBlocks, 256, 0, s>>>(x, n, scratch + 1);
  TREX_CUDA_LAUNCHED();
  sum_partials_kernel<<<1, 256, 0, s>>>(scratch + 1, kSumSquaresBlocks, scratch);
  TREX_CUDA_LAUNCHED();
}
void permute_groups(bf16* out, const bf16* in, int64_t N, int64_t G, int64_t X, bool to_group_major,
                    cudaStream_t s) {
  if (N * G * X <= 0) return;
  if (X % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
      N * G * X / 8 + int64_t(kThreads) * 65535 * 64 < (int64_t(1) << 32)) {
    permute8_kernel<<<grid_for(N * G * X / 8), kThreads, 0, s>>>(reinterpret_cast<uint4*>(out),
                                                                   reinterpret_cast<const uint4*>(in), uint32_t(N),
                                                                   uint32_t(G), uint32_t(X / 8), to_group_major);
    TREX_CUDA_LAUNCHED();
    return;
  }
  permute_kernel<<<grid_for(N * G * X), kThreads, 0, s>>>(out, in, N, G, X, to_group_major);
  TREX_CUDA_LAUNCHED();
}
void embed_streams_fwd(bf16* X, const int32_t* ids, const bf16* table, int64_t N, int64_t d, int64_t n_hc,
                       cudaStream_t s) {
  if (N <= 0) return;
  embed_fwd_kernel<<<unsigned(N), kThreads, 0, s>>>(X, ids, table, d, n_hc);
  TREX_CUDA_LAUNCHED();
}
void embed_streams_bwd(float* dtable, const int32_t* ids, const int32_t* order, const int32_t* seg, int64_t n_seg,
                       const float* dX, int64_t d, int64_t n_hc, cudaStream_t s) {
  if (n_seg <= 0) return;
  embed_bwd_kernel<<<unsigned(n_seg), kThreads, 0, s>>>(dtable, ids, order, seg, dX, d, n_hc);
  TREX_CUDA_LAUNCHED();
}

void embed_bwd_plan(const int32_t* ids, int64_t N, std::vector<int32_t>* order, std::vector<int32_t>* seg) {
  order->resize(size_t(N));
  std::iota(order->begin(), order->end(), 0);
  std::stable_sort(order->begin(), order->end(), [ids](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  seg->clear();
  for (int64_t k = 0; k < N; ++k)
    if (k == 0 || ids[(*order)[size_t(k)]] != ids[(*order)[size_t(k - 1)]]) seg->push_back(int32_t(k));
  seg->push_back(int32_t(N));
}

}  // namespace trex::cuda
