// Generic sparse attention (see attention_generic.h): one block of kThreads per (query, head); each thread
// owns the channels ch = tid, tid + kThreads, ... of the fp32 query / accumulator rows kept in shared memory.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/attention_generic.h"
#include "kernels/cuda/attention_dkv_reduce.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/block_reduce.cuh"

namespace trex::cuda {

namespace {

constexpr int kThreads = 64;

using reduce::block_sum;  // red: kThreads / 32 floats of shared memory

// Key t of query i: window rows first, then compressed slots. Null for an empty (-1) slot.
struct KeyWalk {
  const bf16 *kv, *cmp;
  SparseKeySets keys;
  int64_t i, c, n_win, n_cmp;
  __device__ KeyWalk(const bf16* kv_, const bf16* cmp_, const SparseKeySets& k, int64_t i_, int64_t c_)
      : kv(kv_), cmp(cmp_), keys(k), i(i_), c(c_) {
    n_win = i - keys.win_begin[i] + 1;
    if (keys.cmp_sel)
      n_cmp = keys.k_sel;
    else if (keys.cmp_begin)
      n_cmp = keys.cmp_end[i] - keys.cmp_begin[i];
    else
      n_cmp = 0;
  }
  __device__ int64_t count() const { return n_win + n_cmp; }
  // Row index (window: kv row; compressed: entry) and whether it is a compressed entry; -1 = empty slot.
  __device__ int64_t row(int64_t t, bool* compressed) const {
    if (t < n_win) {
      *compressed = false;
      return keys.win_begin[i] + t;
    }
    *compressed = true;
    const int64_t s = t - n_win;
    return keys.cmp_sel ? keys.cmp_sel[i * keys.k_sel + s] : keys.cmp_begin[i] + s;
  }
};

__global__ void generic_fwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink,
                                   int64_t H, int64_t c, SparseKeySets keys, bf16* o, float* lse,
                                   float scale) {
  extern __shared__ float sm[];
  float* qs = sm;           // [c]
  float* acc = sm + c;      // [c]
  float* red = sm + 2 * c;  // [kThreads / 32]
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const bf16* qh = q + (i * H + h) * c;
  for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) qs[ch] = __bfloat162float(qh[ch]), acc[ch] = 0.f;
  __syncthreads();
  // The sink is a key with logit sink[h] and no value: start the running max / sum from it.
  float m = sink[h], l = 1.f;
  const KeyWalk walk(kv, cmp, keys, i, c);
  for (int64_t t = 0; t < walk.count(); ++t) {
    bool compressed;
    const int64_t r = walk.row(t, &compressed);
    if (r < 0) continue;  // uniform over the block
    const bf16* k = (compressed ? cmp : kv) + r * c;
    float part = 0.f;
    for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) part += qs[ch] * __bfloat162float(k[ch]);
    const float z = block_sum(part, red) * scale;
    const float mn = fmaxf(m, z), corr = expf(m - mn), p = expf(z - mn);
    l = l * corr + p;
    for (int64_t ch = threadIdx.x; ch < c; ch += kThreads)
      acc[ch] = acc[ch] * corr + p * __bfloat162float(k[ch]);
    m = mn;
  }
  bf16* oh = o + (i * H + h) * c;
  for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) oh[ch] = __float2bfloat16(acc[ch] / l);
  if (threadIdx.x == 0) lse[i * H + h] = m + logf(l);
}

__global__ void generic_bwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink,
                                   int64_t H, int64_t c, SparseKeySets keys, const bf16* o, const float* lse,
                                   const bf16* do_, bf16* dq, dkv_reduce::PartOut po, float* sink_part,
                                   float scale) {
  extern __shared__ float sm[];
  float* qs = sm;           // [c]
  float* dos = sm + c;      // [c]
  float* dqs = sm + 2 * c;  // [c]
  float* red = sm + 3 * c;  // [kThreads / 32]
  const int64_t i = po.u0 + blockIdx.x, h = blockIdx.y, row = i * H + h;
  float dpart = 0.f;
  for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) {
    qs[ch] = __bfloat162float(q[row * c + ch]);
    dos[ch] = __bfloat162float(do_[row * c + ch]);
    dqs[ch] = 0.f;
    dpart += dos[ch] * __bfloat162float(o[row * c + ch]);
  }
  const float D = block_sum(dpart, red);  // sum_c do . o = sum_j p_j (do . v_j)
  const float L = lse[row];
  const KeyWalk walk(kv, cmp, keys, i, c);
  for (int64_t t = 0; t < walk.count(); ++t) {
    bool compressed;
    const int64_t r = walk.row(t, &compressed);
    if (r < 0) continue;
    const bf16* k = (compressed ? cmp : kv) + r * c;
    // This (query, head)'s dK + dV of key slot t: its partial row (attention_dkv_reduce.h sums them in order).
    float* dk = po.part + ((int64_t(blockIdx.x) * po.n_slots + t) * H + h) * c;
    float pz = 0.f, pd = 0.f;
    for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) {
      const float kc = __bfloat162float(k[ch]);
      pz += qs[ch] * kc;
      pd += dos[ch] * kc;
    }
    const float z = block_sum(pz, red) * scale;
    const float dp = block_sum(pd, red);
    const float p = expf(z - L), dz = p * (dp - D) * scale;
    for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) {
      dqs[ch] += dz * __bfloat162float(k[ch]);
      dk[ch] = dz * qs[ch] + p * dos[ch];  // K = V: dK + dV
    }
  }
  for (int64_t ch = threadIdx.x; ch < c; ch += kThreads) dq[row * c + ch] = __float2bfloat16(dqs[ch]);
  // d(loss)/d(sink) of this (query, head): the sink's probability times (0 - D).
  if (threadIdx.x == 0) sink_part[row] = -expf(sink[h] - L) * D;
}

// dsink[h] += sum_i part[i, h], one block per head, in a fixed order.
__global__ void generic_dsink_kernel(float* dsink, const float* part, int64_t N, int64_t H) {
  __shared__ float red[kThreads / 32 + 1];
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += kThreads) v += part[i * H + blockIdx.x];
  const float t = block_sum(v, red);
  if (threadIdx.x == 0) dsink[blockIdx.x] += t;
}

void check_args(const char* what, int64_t N, int64_t H, int64_t c, const SparseKeySets& keys) {
  TREX_CHECK(N >= 0 && H > 0 && c > 0, "{}: N {} H {} c {}", what, N, H, c);
  TREX_CHECK(N < (int64_t(1) << 31) && H <= 65535, "{}: grid N {} x H {} too large", what, N, H);
  TREX_CHECK(keys.win_begin, "{}: no window (win_begin is null)", what);
  TREX_CHECK(!keys.cmp_sel || keys.k_sel > 0, "{}: cmp_sel with k_sel {}", what, keys.k_sel);
  TREX_CHECK(bool(keys.cmp_begin) == bool(keys.cmp_end), "{}: cmp_begin and cmp_end must both be set", what);
}

// One unit per query, one block per (query, head).
dkv_reduce::Plan generic_plan(int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys) {
  dkv_reduce::Units u;
  u.N = N, u.E = E, u.H = H, u.c = c, u.qb = 1, u.G = H;
  u.n_slots = dkv_reduce::slots_bound(keys, E, 1);
  return dkv_reduce::make_plan(u);
}

}  // namespace

void sparse_attention_generic_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink,
                                  int64_t N, int64_t H, int64_t c, const SparseKeySets& keys, bf16* o,
                                  float* lse, cudaStream_t s) {
  check_args("sparse_attention_generic_fwd", N, H, c, keys);
  if (N == 0) return;
  const size_t smem = size_t(2 * c + kThreads / 32 + 1) * sizeof(float);
  TREX_CHECK(smem <= 48 * 1024, "sparse_attention_generic_fwd: head dim {} needs {} bytes of shared memory",
             c, smem);
  generic_fwd_kernel<<<dim3(unsigned(N), unsigned(H)), kThreads, smem, s>>>(
      q, kv, cmp, sink, H, c, keys, o, lse, float(1.0 / std::sqrt(double(c))));
  TREX_CUDA_LAUNCHED();
}

int64_t sparse_attention_generic_bwd_scratch(int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys) {
  if (N == 0) return 1;
  return int64_t((generic_plan(N, E, H, c, keys).bytes + sizeof(float) - 1) / sizeof(float));
}

void sparse_attention_generic_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink,
                                  int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys,
                                  const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                                  float* dcmp, float* dsink, float* scratch, cudaStream_t s) {
  check_args("sparse_attention_generic_bwd", N, H, c, keys);
  TREX_CHECK(E == 0 || dcmp, "sparse_attention_generic_bwd: {} compressed entries but dcmp is null", E);
  if (N == 0) return;
  const size_t smem = size_t(3 * c + kThreads / 32 + 1) * sizeof(float);
  TREX_CHECK(smem <= 48 * 1024, "sparse_attention_generic_bwd: head dim {} needs {} bytes of shared memory",
             c, smem);
  const dkv_reduce::Plan plan = generic_plan(N, E, H, c, keys);
  float* sink_part = dkv_reduce::sink_part(plan, scratch);
  dkv_reduce::run(plan, keys, scratch, dkv, dcmp, s, [&](const dkv_reduce::PartOut& po, int64_t n_units) {
    generic_bwd_kernel<<<dim3(unsigned(n_units), unsigned(H)), kThreads, smem, s>>>(
        q, kv, cmp, sink, H, c, keys, o, lse, do_, dq, po, sink_part, float(1.0 / std::sqrt(double(c))));
    TREX_CUDA_LAUNCHED();
  });
  generic_dsink_kernel<<<unsigned(H), kThreads, 0, s>>>(dsink, sink_part, N, H);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
