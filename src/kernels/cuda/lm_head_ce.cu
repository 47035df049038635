#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/lm_head_ce.h"

namespace trex::cuda {
namespace {

constexpr int kThreads = 256;

struct Scratch {
  float* logits;   // [n, chunk]
  bf16* dlogits;   // [n, chunk]
  float* run_max;  // [n]
  float* run_sum;  // [n]
  float* target;   // [n] target logit
};

size_t align256(size_t b) {
  return (b + 255) / 256 * 256;
}

Scratch carve(const LmHeadCeShape& s, void* base) {
  char* p = static_cast<char*>(base);
  Scratch r;
  r.logits = reinterpret_cast<float*>(p), p += align256(size_t(s.n * s.chunk) * 4);
  r.dlogits = reinterpret_cast<bf16*>(p), p += align256(size_t(s.n * s.chunk) * 2);
  r.run_max = reinterpret_cast<float*>(p), p += align256(size_t(s.n) * 4);
  r.run_sum = reinterpret_cast<float*>(p), p += align256(size_t(s.n) * 4);
  r.target = reinterpret_cast<float*>(p);
  return r;
}

__device__ inline float block_reduce(float v, float* red, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();
  return r;
}

__global__ void init_rows_kernel(float* run_max, float* run_sum, float* target, int64_t n) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  run_max[r] = -INFINITY;
  run_sum[r] = 0.f;
  target[r] = 0.f;
}

// One block per row: merge the chunk's max / sum-exp into the row's running pair; pick up the target logit.
// One read of the chunk's logits: each thread keeps an online (max, sum-exp) pair, rescaled to the block max.
__global__ void chunk_update_kernel(const float* logits, int64_t vc, int64_t v0, const int32_t* targets,
                                    float* run_max, float* run_sum, float* target) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * vc;
  float m = -INFINITY, e = 0.f;
  for (int64_t v = threadIdx.x; v < vc; v += kThreads) {
    const float x = z[v];
    if (x > m) {
      e = e * __expf(m - x) + 1.f;
      m = x;
    } else {
      e += __expf(x - m);
    }
  }
  const float mx = block_reduce(m, red, true);
  const float se = block_reduce(m == -INFINITY ? 0.f : e * __expf(m - mx), red, false);
  if (threadIdx.x == 0) {
    const float m_old = run_max[r], m_new = fmaxf(m_old, mx);
    run_sum[r] = run_sum[r] * __expf(m_old - m_new) + se * __expf(mx - m_new);
    run_max[r] = m_new;
    const int64_t t = targets[r];
    if (t >= v0 && t < v0 + vc) target[r] = z[t - v0];
  }
}

__global__ void finish_rows_kernel(const float* run_max, const float* run_sum, const float* target,
                                   const int32_t* targets, int64_t n, float* lse, float* row_loss) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const float l = run_max[r] + logf(run_sum[r]);
  lse[r] = l;
  row_loss[r] = targets[r] >= 0 ? l - target[r] : 0.f;
}

// loss_sum = sum of row_loss, one block, fixed order.
__global__ void sum_kernel(const float* x, int64_t n, float* out) {
  __shared__ float red[kThreads / 32];
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += x[i];
  acc = block_reduce(acc, red, false);
  if (threadIdx.x == 0) out[0] = acc;
}

// Block (row r, 256 columns): dlogits = scale * (softmax - onehot(target)) in bf16; ignored rows get zeros.
__global__ void dlogits_kernel(const float* logits, int64_t vc, int64_t v0, const int32_t* targets,
                               const float* lse, float scale, bf16* dl) {
  const int64_t r = blockIdx.x, v = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (v >= vc) return;
  const int32_t t = targets[r];
  float g = 0.f;
  if (t >= 0) g = scale * (__expf(logits[r * vc + v] - lse[r]) - (v0 + v == t ? 1.f : 0.f));
  dl[r * vc + v] = __float2bfloat16(g);
}

// One block per row of a row block's full-vocabulary logits z [V] (fp32): lse and the row loss, then the row's
// dlogits = scale * (softmax - onehot(target)) in bf16 (zeros for an ignored row). Two reads of the row: the
// first an online (max, sum-exp) per thread, the second after the block knows the row's lse. kVec 4: float4
// loads and 8-byte stores (V % 4 == 0, rows 16-byte aligned); 1 otherwise.
template <int kVec>
__global__ void row_grad_kernel(const float* logits, int64_t V, const int32_t* targets, float scale, float* lse,
                                float* row_loss, bf16* dl) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * V;
  bf16* o = dl + r * V;
  const int32_t t = targets[r];
  const int64_t nv = V / kVec;
  float m = -INFINITY, e = 0.f;
  for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
    float x[kVec];
    if constexpr (kVec == 4) {
      const float4 q = reinterpret_cast<const float4*>(z)[i];
      x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
    } else {
      x[0] = z[i];
    }
    float mv = x[0];
#pragma unroll
    for (int j = 1; j < kVec; ++j) mv = fmaxf(mv, x[j]);
    if (mv > m) e *= __expf(m - mv), m = mv;
#pragma unroll
    for (int j = 0; j < kVec; ++j) e += __expf(x[j] - m);
  }
  const float mx = block_reduce(m, red, true);
  const float se = block_reduce(m == -INFINITY ? 0.f : e * __expf(m - mx), red, false);
  const float l = mx + logf(se);
  if (threadIdx.x == 0) {
    lse[r] = l;
    row_loss[r] = t >= 0 ? l - z[t] : 0.f;
  }
  const float g = t >= 0 ? scale : 0.f;
  for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
    float x[kVec];
    if constexpr (kVec == 4) {
      const float4 q = reinterpret_cast<const float4*>(z)[i];
      x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
    } else {
      x[0] = z[i];
    }
    __nv_bfloat16 y[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      y[j] = __float2bfloat16(g * (__expf(x[j] - l) - (i * kVec + j == t ? 1.f : 0.f)));
    if constexpr (kVec == 4) {
      uint2 w;
      __nv_bfloat162 lo(y[0], y[1]), hi(y[2], y[3]);
      w.x = *reinterpret_cast<uint32_t*>(&lo), w.y = *reinterpret_cast<uint32_t*>(&hi);
      reinterpret_cast<uint2*>(o)[i] = w;
    } else {
      o[i] = y[0];
    }
  }
}

unsigned blocks(int64_t n) {
  return unsigned((n + kThreads - 1) / kThreads);
}

void check_shape(const LmHeadCeShape& s) {
  TREX_CHECK(s.n >= 0 && s.d > 0 && s.vocab > 0 && s.chunk > 0,
             "lm_head_ce: bad shape n={} d={} vocab={} chunk={}", s.n, s.d, s.vocab, s.chunk);
  TREX_CHECK(s.n < (int64_t(1) << 31) && (s.chunk + kThreads - 1) / kThreads <= 65535,
             "lm_head_ce: n={} or chunk={} too large for the (row, column-block) grid", s.n, s.chunk);
}

}  // namespace

size_t lm_head_ce_scratch_bytes(const LmHeadCeShape& s) {
  return align256(size_t(s.n * s.chunk) * 4) + align256(size_t(s.n * s.chunk) * 2) +
         3 * align256(size_t(s.n) * 4);
}

void lm_head_ce_fwd(Gemm& gemm, const LmHeadCeShape& s, const bf16* hidden, const bf16* w_head,
                    const int32_t* targets, float* lse, float* row_loss, float* loss_sum, void* scratch,
                    cudaStream_t stream) {
  check_shape(s);
  if (s.n == 0) return;
  Scratch sc = carve(s, scratch);
  init_rows_kernel<<<blocks(s.n), kThreads, 0, stream>>>(sc.run_max, sc.run_sum, sc.target, s.n);
  TREX_CUDA_LAUNCHED();
  for (int64_t v0 = 0; v0 < s.vocab; v0 += s.chunk) {
    const int64_t vc = std::min(s.chunk, s.vocab - v0);
    gemm.run({s.n, vc, s.d, false, true, GemmType::BF16, GemmType::F32}, hidden, w_head + v0 * s.d, sc.logits,
             1.f, 0.f, stream);
    chunk_update_kernel<<<unsigned(s.n), kThreads, 0, stream>>>(sc.logits, vc, v0, targets, sc.run_max,
                                                                sc.run_sum, sc.target);
    TREX_CUDA_LAUNCHED();
  }
  finish_rows_kernel<<<blocks(s.n), kThreads, 0, stream>>>(sc.run_max, sc.run_sum, sc.target, targets, s.n,
                                                           lse, row_loss);
  TREX_CUDA_LAUNCHED();
  if (loss_sum) {
    sum_kernel<<<1, kThreads, 0, stream>>>(row_loss, s.n, loss_sum);
    TREX_CUDA_LAUNCHED();
  }
}

void lm_head_ce_bwd(Gemm& gemm, const LmHeadCeShape& s, const bf16* hidden, const bf16* w_head,
                    const int32_t* targets, const float* lse, float scale, float* dhidden, float* dw_head,
                    void* scratch, cudaStream_t stream) {
  check_shape(s);
  if (s.n == 0) return;
  Scratch sc = carve(s, scratch);
  for (int64_t v0 = 0; v0 < s.vocab; v0 += s.chunk) {
    const int64_t vc = std::min(s.chunk, s.vocab - v0);
    gemm.run({s.n, vc, s.d, false, true, GemmType::BF16, GemmType::F32}, hidden, w_head + v0 * s.d, sc.logits,
             1.f, 0.f, stream);
    dlogits_kernel<<<dim3(unsigned(s.n), blocks(vc)), kThreads, 0, stream>>>(sc.logits, vc, v0, targets, lse,
                                                                              scale, sc.dlogits);
    TREX_CUDA_LAUNCHED();
    if (dhidden)
      gemm.run({s.n, s.d, vc, false, false, GemmType::BF16, GemmType::F32}, sc.dlogits, w_head + v0 * s.d,
               dhidden, 1.f, 1.f, stream);
    if (dw_head)
      gemm.run({vc, s.d, s.n, true, false, GemmType::BF16, GemmType::F32}, sc.dlogits, hidden,
               dw_head + v0 * s.d, 1.f, 1.f, stream);
  }
}

namespace {
// Row-block sizes of lm_head_ce_fwd_grad: logits blocks of R rows inside dW groups of G rows.
int64_t fwd_grad_rows(const LmHeadCeShape& s) { return std::min(s.rows, s.n); }
int64_t fwd_grad_group(const LmHeadCeShape& s) {
  return std::max(fwd_grad_rows(s), std::min(s.grad_rows > 0 ? s.grad_rows : s.rows, s.n));
}
}  // namespace

size_t lm_head_ce_fwd_grad_scratch_bytes(const LmHeadCeShape& s) {
  return align256(size_t(fwd_grad_rows(s) * s.vocab) * 4) + align256(size_t(fwd_grad_group(s) * s.vocab) * 2);
}

void lm_head_ce_fwd_grad(Gemm& gemm, const LmHeadCeShape& s, const bf16* hidden, const bf16* w_head,
                         const int32_t* targets, float scale, float* lse, float* row_loss, float* loss_sum,
                         float* dhidden, float* dw_head, void* scratch, cudaStream_t stream) {
  TREX_CHECK(s.n >= 0 && s.d > 0 && s.vocab > 0 && s.rows > 0 && s.grad_rows >= 0 && s.n < (int64_t(1) << 31),
             "lm_head_ce_fwd_grad: bad shape n={} d={} vocab={} rows={} grad_rows={}", s.n, s.d, s.vocab, s.rows,
             s.grad_rows);
  if (s.n == 0) return;
  const int64_t R = fwd_grad_rows(s), G = fwd_grad_group(s);
  float* logits = static_cast<float*>(scratch);
  bf16* dl = reinterpret_cast<bf16*>(static_cast<char*>(scratch) + align256(size_t(R * s.vocab) * 4));
  for (int64_t g0 = 0; g0 < s.n; g0 += G) {
    const int64_t ng = std::min(G, s.n - g0);
    for (int64_t r0 = g0; r0 < g0 + ng; r0 += R) {
      const int64_t nr = std::min(R, g0 + ng - r0);
      bf16* dlr = dl + (r0 - g0) * s.vocab;
      gemm.run({nr, s.vocab, s.d, false, true, GemmType::BF16, GemmType::F32}, hidden + r0 * s.d, w_head, logits,
               1.f, 0.f, stream);
      if (s.vocab % 4 == 0)
        row_grad_kernel<4><<<unsigned(nr), kThreads, 0, stream>>>(logits, s.vocab, targets + r0, scale, lse + r0,
                                                                  row_loss + r0, dlr);
      else
        row_grad_kernel<1><<<unsigned(nr), kThreads, 0, stream>>>(logits, s.vocab, targets + r0, scale, lse + r0,
                                                                  row_loss + r0, dlr);
      TREX_CUDA_LAUNCHED();
      if (dhidden)
        gemm.run({nr, s.d, s.vocab, false, false, GemmType::BF16, GemmType::F32}, dlr, w_head, dhidden + r0 * s.d,
                 1.f, 0.f, stream);
    }
    // One dW GEMM per group: K = ng rows, so its fp32 [vocab, d] output is read and written n / G times.
    if (dw_head)
      gemm.run({s.vocab, s.d, ng, true, false, GemmType::BF16, GemmType::F32}, dl, hidden + g0 * s.d, dw_head, 1.f,
               1.f, stream);
  }
  if (loss_sum) {
    sum_kernel<<<1, kThreads, 0, stream>>>(row_loss, s.n, loss_sum);
    TREX_CUDA_LAUNCHED();
  }
}

}  // namespace trex::cuda
