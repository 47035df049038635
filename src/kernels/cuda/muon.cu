#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/muon.h"

namespace trex::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;

// Block sum in a fixed order (warp shuffles, then the first warp over the warp sums): deterministic.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double s = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kThreads / 32; ++w) s += warp_sums[w];
  return s;  // valid in thread 0
}

// Block (chunk, matrix): momentum and Nesterov input exactly as the CPU rule (separate multiply and add, no FMA
// contraction), gathered into the contiguous batch, and the chunk's sum of squares.
__global__ void muon_momentum_kernel(const int64_t* __restrict__ offs, int64_t n, float* g, float* mom, float* x,
                                     double* partial, float mu, bool nesterov, bool zero_grad, float gs) {
  const int64_t b = blockIdx.y, off = offs[b];
  float* gp = g + off;
  float* mp = mom + off;
  float* xp = x + b * n;
  const int64_t begin = int64_t(blockIdx.x) * kMuonChunk, end = n < begin + kMuonChunk ? n : begin + kMuonChunk;
  double ss = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float gi = __fmul_rn(gp[i], gs);
    const float mi = __fadd_rn(__fmul_rn(mu, mp[i]), gi);
    mp[i] = mi;
    const float in = nesterov ? __fadd_rn(__fmul_rn(mu, mi), gi) : mi;
    xp[i] = in;
    ss += double(in) * double(in);
    if (zero_grad) gp[i] = 0.f;
  }
  ss = block_sum(ss);
  if (threadIdx.x == 0) partial[b * gridDim.x + blockIdx.x] = ss;
}

__global__ void sum_squares_kernel(const float* x, int64_t n, double* partial) {
  const int64_t b = blockIdx.y;
  const float* xp = x + b * n;
  const int64_t begin = int64_t(blockIdx.x) * kMuonChunk, end = n < begin + kMuonChunk ? n : begin + kMuonChunk;
  double ss = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) ss += double(xp[i]) * double(xp[i]);
  ss = block_sum(ss);
  if (threadIdx.x == 0) partial[b * gridDim.x + blockIdx.x] = ss;
}

// x <- x * float(1 / (||x||_F + 1e-7)) (the CPU's rounding of the factor), x16 = bf16(x). Every block sums its
// matrix's partials itself, in chunk order.
__global__ void normalise_kernel(float* x, bf16* x16, const double* partial, int64_t n) {
  const int64_t b = blockIdx.y;
  __shared__ float inv;
  if (threadIdx.x == 0) {
    double ss = 0;
    for (unsigned c = 0; c < gridDim.x; ++c) ss += partial[b * gridDim.x + c];
    inv = float(1.0 / (sqrt(ss) + 1e-7));
  }
  __syncthreads();
  float* xp = x + b * n;
  bf16* hp = x16 + b * n;
  const int64_t begin = int64_t(blockIdx.x) * kMuonChunk, end = n < begin + kMuonChunk ? n : begin + kMuonChunk;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = xp[i] * inv;
    xp[i] = v;
    hp[i] = __float2bfloat16(v);
  }
}

__global__ void cast_kernel(bf16* dst, const float* src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    dst[i] = __float2bfloat16(src[i]);
}

// W <- W shrink - scale O (as the CPU: two products and a difference), bf16 copy refreshed.
__global__ void muon_apply_kernel(const int64_t* __restrict__ offs, int64_t n, float* w, bf16* wb, const float* x,
                                  float shrink, float scale) {
  const int64_t b = blockIdx.y, off = offs[b];
  float* wp = w + off;
  const float* xp = x + b * n;
  const int64_t begin = int64_t(blockIdx.x) * kMuonChunk, end = n < begin + kMuonChunk ? n : begin + kMuonChunk;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = __fsub_rn(__fmul_rn(wp[i], shrink), __fmul_rn(scale, xp[i]));
    wp[i] = v;
    if (wb) wb[off + i] = __float2bfloat16(v);
  }
}

// muon_momentum_kernel's arithmetic on one contiguous run; the input replaces g.
__global__ void momentum_range_kernel(float* g, float* mom, int64_t n, float mu, bool nesterov, float gs) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float gi = __fmul_rn(g[i], gs);
    const float mi = __fadd_rn(__fmul_rn(mu, mom[i]), gi);
    mom[i] = mi;
    g[i] = nesterov ? __fadd_rn(__fmul_rn(mu, mi), gi) : mi;
  }
}

// The batch's inputs gathered from u into x, with muon_momentum_kernel's per-block partial sums of squares.
__global__ void gather_inputs_kernel(const int64_t* __restrict__ offs, int64_t n, const float* u, float* x,
                                     double* partial) {
  const int64_t b = blockIdx.y;
  const float* up = u + offs[b];
  float* xp = x + b * n;
  const int64_t begin = int64_t(blockIdx.x) * kMuonChunk, end = n < begin + kMuonChunk ? n : begin + kMuonChunk;
  double ss = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float in = up[i];
    xp[i] = in;
    ss += double(in) * double(in);
  }
  ss = block_sum(ss);
  if (threadIdx.x == 0) partial[b * gridDim.x + blockIdx.x] = ss;
}

// muon_apply_kernel on the elements [lo, hi) of each matrix, the fp32 weight at its shard position.
__global__ void apply_ranges_kernel(const int64_t* __restrict__ offs, const int64_t* __restrict__ ranges, int64_t n,
                                    float* w, bf16* wb, const float* x, float shrink, float scale) {
  const int64_t b = blockIdx.y, off = offs[b];
  const int64_t lo = ranges[3 * b], hi = ranges[3 * b + 1], sh = ranges[3 * b + 2];
  const float* xp = x + b * n;
  const int64_t begin = int64_t(blockIdx.x) * kMuonChunk, end = n < begin + kMuonChunk ? n : begin + kMuonChunk;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    if (i < lo || i >= hi) continue;
    float* wp = w + sh + (i - lo);
    const float v = __fsub_rn(__fmul_rn(*wp, shrink), __fmul_rn(scale, xp[i]));
    *wp = v;
    if (wb) wb[off + i] = __float2bfloat16(v);
  }
}

int64_t chunks_of(int64_t n) { return (n + kMuonChunk - 1) / kMuonChunk; }

void grow(DeviceBuffer& b, size_t bytes) {
  if (b.bytes() < bytes) b = DeviceBuffer(bytes);
}

}  // namespace

void MuonScratch::reserve(int64_t batch, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols, s = std::min(rows, cols);
  grow(x32_, size_t(batch * n) * 4);
  grow(x16_, size_t(batch * n) * 2);
  grow(a16_, size_t(batch * s * s) * 2);
  grow(b16_, size_t(batch * s * s) * 2);
  grow(partial_, size_t(batch * chunks_of(n)) * 8);
}

void newton_schulz_batched(Gemm& gemm, float* x32, bf16* x16, bf16* a16, bf16* b16, int64_t batch, int64_t rows,
                           int64_t cols, int fast_steps, int final_steps, cudaStream_t st) {
  TREX_CHECK(batch >= 1 && batch <= 65535 && rows >= 1 && cols >= 1,
             "newton_schulz_batched: batch {} of {} x {} matrices out of range", batch, rows, cols);
  // Work on the short side s: wide X [s, L] uses A = X X^T and X <- a X + B X; tall X [L, s] the transposed
  // identities A = X^T X and X <- a X + X B (B is a polynomial of the symmetric A), without moving X.
  const bool wide = rows <= cols;
  const int64_t s = wide ? rows : cols, L = wide ? cols : rows, n = rows * cols;
  GemmShape gram;  // A = X X^T (wide) or X^T X (tall), bf16 out
  gram.m = s, gram.n = s, gram.k = L, gram.trans_a = !wide, gram.trans_b = wide, gram.batch = batch;
  GemmShape square;  // B = c A A + b B, with B preloaded with A
  square.m = s, square.n = s, square.k = s, square.batch = batch;
  GemmShape update;  // X32 = B X (wide) or X B (tall) + a X32, fp32 out
  update.m = wide ? s : L, update.n = wide ? L : s, update.k = s, update.c = GemmType::F32, update.batch = batch;
  const int total = fast_steps + final_steps;
  for (int it = 0; it < total; ++it) {
    const bool fast = it < fast_steps;
    const float ca = fast ? 3.4445f : 2.0f, cb = fast ? -4.7750f : -1.5f, cc = fast ? 2.0315f : 0.5f;
    gemm.run(gram, x16, x16, a16, 1.f, 0.f, st);
    TREX_CUDA(cudaMemcpyAsync(b16, a16, size_t(batch * s * s) * 2, cudaMemcpyDeviceToDevice, st));
    gemm.run(square, a16, a16, b16, cc, cb, st);
    if (wide)
      gemm.run(update, b16, x16, x32, 1.f, ca, st);
    else
      gemm.run(update, x16, b16, x32, 1.f, ca, st);
    if (it + 1 < total) {
      const int64_t blocks = std::min<int64_t>((batch * n + kThreads - 1) / kThreads, 132 * 16);
      cast_kernel<<<unsigned(blocks), kThreads, 0, st>>>(x16, x32, batch * n);
      TREX_CUDA_LAUNCHED();
    }
  }
}

void muon_normalise(float* x32, bf16* x16, double* partial, int64_t batch, int64_t rows, int64_t cols,
                    cudaStream_t st) {
  const int64_t n = rows * cols;
  const dim3 grid(unsigned(chunks_of(n)), unsigned(batch));
  sum_squares_kernel<<<grid, kThreads, 0, st>>>(x32, n, partial);
  TREX_CUDA_LAUNCHED();
  normalise_kernel<<<grid, kThreads, 0, st>>>(x32, x16, partial, n);
  TREX_CUDA_LAUNCHED();
}

void muon_step_batched(Gemm& gemm, MuonScratch& scratch, const int64_t* d_offsets, int64_t batch, int64_t rows,
                       int64_t cols, float* w, float* g, float* momentum, bf16* w_bf16, const MuonStep& p,
                       cudaStream_t st) {
  if (batch <= 0) return;
  TREX_CHECK(batch <= 65535, "muon_step_batched: batch {} over the grid limit 65535", batch);
  scratch.reserve(batch, rows, cols);
  const int64_t n = rows * cols;
  const dim3 grid(unsigned(chunks_of(n)), unsigned(batch));
  muon_momentum_kernel<<<grid, kThreads, 0, st>>>(d_offsets, n, g, momentum, scratch.x32(), scratch.partial(),
                                                  float(p.momentum), p.nesterov, p.zero_grad, p.grad_scale);
  TREX_CUDA_LAUNCHED();
  normalise_kernel<<<grid, kThreads, 0, st>>>(scratch.x32(), scratch.x16(), scratch.partial(), n);
  TREX_CUDA_LAUNCHED();
  newton_schulz_batched(gemm, scratch.x32(), scratch.x16(), scratch.a16(), scratch.b16(), batch, rows, cols,
                        p.ns_fast_steps, p.ns_final_steps, st);
  const float scale = float(p.lr * std::sqrt(double(std::max(rows, cols))) * p.update_rms);
  const float shrink = float(1.0 - p.lr * p.weight_decay);
  muon_apply_kernel<<<grid, kThreads, 0, st>>>(d_offsets, n, w, w_bf16, scratch.x32(), shrink, scale);
  TREX_CUDA_LAUNCHED();
}

void muon_momentum_range(float* g, float* momentum, int64_t n, const MuonStep& p, cudaStream_t st) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 132 * 16);
  momentum_range_kernel<<<unsigned(blocks), kThreads, 0, st>>>(g, momentum, n, float(p.momentum), p.nesterov,
                                                               p.grad_scale);
  TREX_CUDA_LAUNCHED();
}

void muon_orthogonalise_batched(Gemm& gemm, MuonScratch& scratch, const int64_t* d_offsets, int64_t batch,
                                int64_t rows, int64_t cols, const float* u, const MuonStep& p, cudaStream_t st) {
  if (batch <= 0) return;
  TREX_CHECK(batch <= 65535, "muon_orthogonalise_batched: batch {} over the grid limit 65535", batch);
  scratch.reserve(batch, rows, cols);
  const int64_t n = rows * cols;
  const dim3 grid(unsigned(chunks_of(n)), unsigned(batch));
  gather_inputs_kernel<<<grid, kThreads, 0, st>>>(d_offsets, n, u, scratch.x32(), scratch.partial());
  TREX_CUDA_LAUNCHED();
  normalise_kernel<<<grid, kThreads, 0, st>>>(scratch.x32(), scratch.x16(), scratch.partial(), n);
  TREX_CUDA_LAUNCHED();
  newton_schulz_batched(gemm, scratch.x32(), scratch.x16(), scratch.a16(), scratch.b16(), batch, rows, cols,
                        p.ns_fast_steps, p.ns_final_steps, st);
}

void muon_apply_ranges(const MuonScratch& scratch, const int64_t* d_offsets, const int64_t* d_ranges, int64_t batch,
                       int64_t rows, int64_t cols, float* w_shard, bf16* w_bf16, const MuonStep& p, cudaStream_t st) {
  if (batch <= 0) return;
  const int64_t n = rows * cols;
  const dim3 grid(unsigned(chunks_of(n)), unsigned(batch));
  const float scale = float(p.lr * std::sqrt(double(std::max(rows, cols))) * p.update_rms);
  const float shrink = float(1.0 - p.lr * p.weight_decay);
  apply_ranges_kernel<<<grid, kThreads, 0, st>>>(d_offsets, d_ranges, n, w_shard, w_bf16, scratch.x32(), shrink,
                                                 scale);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
