#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/vec_io.cuh"

namespace trex::cuda {
namespace {

constexpr int kPerLane = kRouterMaxExperts / 32;  // experts a lane holds
constexpr int kChunk = 1024;                      // slots per chunk of the permutation plan

__device__ inline float softplus(float z) {
  return z > 20.f ? z : log1pf(expf(z));
}

// One warp per token.
__global__ void router_fwd_kernel(RouterShape s, const float* logits, const float* bias,
                                  const int32_t* tid2eid, int64_t vocab, const int32_t* token_ids,
                                  float* scores, int32_t* sel, float* weight, int32_t* status) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= s.n_tok) return;
  const int E = int(s.n_experts), K = int(s.topk);
  float sc[kPerLane];
  double key[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    sc[i] = 0.f;
    key[i] = -INFINITY;
    if (e < E) {
      sc[i] = sqrtf(softplus(logits[t * E + e]));
      scores[t * E + e] = sc[i];
      key[i] = double(sc[i]) + (bias ? double(bias[e]) : 0.0);
    }
  }
  int chosen[kRouterMaxTopk];
  if (s.hash) {
    int tok = token_ids[t];
    bool bad = tok < 0 || tok >= vocab;
    for (int k = 0; k < K; ++k) {
      int e = bad ? 0 : tid2eid[int64_t(tok) * K + k];
      if (e < 0 || e >= E) bad = true, e = 0;
      chosen[k] = e;
    }
    if (bad && status && lane == 0) atomicExch(status, 1);
  } else {
    unsigned taken = 0;  // bit i: expert lane + 32 i already selected
    for (int k = 0; k < K; ++k) {
      double best = -INFINITY;
      int best_e = E;  // larger than any id: loses ties
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e < E && !((taken >> i) & 1u) && (key[i] > best || best_e == E)) {
          best = key[i];
          best_e = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const double ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
      }
      chosen[k] = best_e;
      if (best_e % 32 == lane) taken |= 1u << (best_e / 32);
    }
  }
  // Gate weights: every lane needs the selected scores; fetch them from the owning lanes.
  double sum = 0, ssel[kRouterMaxTopk];
  for (int k = 0; k < K; ++k) {
    const int e = chosen[k];
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (e == lane + 32 * i) v = sc[i];
    ssel[k] = __shfl_sync(0xffffffffu, v, e % 32);
    sum += ssel[k];
  }
  if (lane < K) {
    double mine = 0;
    int e = 0;
    for (int k = 0; k < K; ++k)
      if (k == lane) mine = ssel[k], e = chosen[k];
    sel[t * K + lane] = e;
    weight[t * K + lane] = float(s.routed_scale * mine / (sum + 1e-20));
  }
}

// One warp per token; lane owns experts lane + 32 i.
__global__ void router_bwd_kernel(RouterShape s, const float* logits, const float* scores, const int32_t* sel,
                                  const float* dweight, const float* dextra, float* dlogits) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= s.n_tok) return;
  const int E = int(s.n_experts), K = int(s.topk);
  double S = 0, dot = 0;
  for (int k = 0; k < K; ++k) {
    const double sk = scores[t * E + sel[t * K + k]];
    S += sk;
    dot += double(dweight[t * K + k]) * sk;
  }
  const double den = S + 1e-20;
  for (int e = lane; e < E; e += 32) {
    double ds = dextra ? double(dextra[t * E + e]) : 0.0;
    for (int k = 0; k < K; ++k)
      if (sel[t * K + k] == e) ds += s.routed_scale * (double(dweight[t * K + k]) / den - dot / (den * den));
    float out = 0.f;
    if (ds != 0.0) {
      const double z = logits[t * E + e], sq = scores[t * E + e];
      out = float(ds * (1.0 / (1.0 + exp(-z))) / (2.0 * sq));
    }
    dlogits[t * E + e] = out;
  }
}

// Per chunk of kChunk slots: how many go to each expert.
__global__ void plan_count_kernel(const int32_t* sel, int64_t nk, int E, int32_t* chunk_counts) {
  extern __shared__ int32_t cnt[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t r0 = int64_t(blockIdx.x) * kChunk;
  for (int64_t r = r0 + threadIdx.x; r < min(nk, r0 + kChunk); r += blockDim.x) atomicAdd(&cnt[sel[r]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[int64_t(blockIdx.x) * E + e] = cnt[e];
}

// One block: chunk bases per expert (exclusive over chunks), then offsets (exclusive over experts).
__global__ void plan_scan_kernel(int32_t* chunk_counts, int64_t n_chunks, int E, int32_t* offsets) {
  extern __shared__ int32_t total[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int32_t v = chunk_counts[c * E + e];
      chunk_counts[c * E + e] = run;  // now the chunk's base within expert e
      run += v;
    }
    total[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = run;
      run += total[e];
    }
    offsets[E] = run;
  }
}

// One warp per chunk, 32 slots at a time in slot order: stable ranks through __match_any_sync.
__global__ void plan_scatter_kernel(const int32_t* sel, int64_t nk, int E, const int32_t* chunk_base,
                                    const int32_t* offsets, int32_t* order, int32_t* slot_pos) {
  extern __shared__ int32_t cnt[];
  const int lane = threadIdx.x;
  for (int e = lane; e < E; e += 32) cnt[e] = 0;
  __syncwarp();
  const int64_t r0 = int64_t(blockIdx.x) * kChunk;
  const int32_t* base = chunk_base + int64_t(blockIdx.x) * E;
  for (int round = 0; round < kChunk / 32; ++round) {
    const int64_t r = r0 + round * 32 + lane;
    const int e = r < nk ? sel[r] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    int32_t pos = 0;
    if (e >= 0) pos = offsets[e] + base[e] + cnt[e] + rank;
    __syncwarp();
    if (e >= 0 && rank == 0) cnt[e] += __popc(peers);
    __syncwarp();
    if (e >= 0) {
      order[pos] = int32_t(r);
      slot_pos[r] = pos;
    }
  }
}

__global__ void expert_counts_kernel(const int32_t* offsets, int E, int32_t* counts) {
  const int e = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (e < E) counts[e] = offsets[e + 1] - offsets[e];
}

__global__ void gather_kernel(bf16* xe, const bf16* u, const int32_t* order, int K, int64_t d) {
  const int64_t p = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(u + int64_t(order[p] / K) * d);
  uint4* dst = reinterpret_cast<uint4*>(xe + p * d);
  for (int64_t v = threadIdx.x; v < d / 8; v += blockDim.x) dst[v] = src[v];
}

// One row per block: dst row (gather ? i : idx[i]) = src row (gather ? idx[i] : i).
template <bool kGather>
__global__ void rows_permute_kernel(bf16* dst, const bf16* src, const int32_t* idx, int64_t d) {
  const int64_t i = blockIdx.x, j = idx[i];
  const uint4* s = reinterpret_cast<const uint4*>(src + (kGather ? j : i) * d);
  uint4* o = reinterpret_cast<uint4*>(dst + (kGather ? i : j) * d);
  for (int64_t v = threadIdx.x; v < d / 8; v += blockDim.x) o[v] = s[v];
}

using vec::unpack8;
using vec::pack8;

__global__ void gather_bwd_kernel(float* du, const bf16* dxe, const int32_t* slot_pos, int K, int64_t d) {
  const int64_t t = blockIdx.x;
  for (int64_t v = threadIdx.x; v < d / 8; v += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < K; ++k) {
      float f[8];
      unpack8(reinterpret_cast<const uint4*>(dxe + int64_t(slot_pos[t * K + k]) * d)[v], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += f[i];
    }
    float* o = du + t * d + v * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] += acc[i];
  }
}

__global__ void combine_kernel(bf16* out, const bf16* ye, const int32_t* slot_pos, const float* weight,
                               const bf16* add, int K, int64_t d) {
  const int64_t t = blockIdx.x;
  for (int64_t v = threadIdx.x; v < d / 8; v += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < K; ++k) {
      const float w = weight ? weight[t * K + k] : 1.f;
      float f[8];
      unpack8(reinterpret_cast<const uint4*>(ye + int64_t(slot_pos[t * K + k]) * d)[v], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, f[i], acc[i]);
    }
    if (add) {
      float f[8];
      unpack8(reinterpret_cast<const uint4*>(add + t * d)[v], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += f[i];
    }
    reinterpret_cast<uint4*>(out + t * d)[v] = pack8(acc);
  }
}

__global__ void combine_accumulate_kernel(float* out, const bf16* ye, const int32_t* slot_pos, const float* weight,
                                          int K, int64_t d) {
  const int64_t t = blockIdx.x;
  for (int64_t v = threadIdx.x; v < d / 8; v += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < K; ++k) {
      const float w = weight[t * K + k];
      float f[8];
      unpack8(reinterpret_cast<const uint4*>(ye + int64_t(slot_pos[t * K + k]) * d)[v], f);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, f[i], acc[i]);
    }
    float4* o = reinterpret_cast<float4*>(out + t * d + v * 8);
    float4 a = o[0], b = o[1];
    a.x += acc[0], a.y += acc[1], a.z += acc[2], a.w += acc[3];
    b.x += acc[4], b.y += acc[5], b.z += acc[6], b.w += acc[7];
    o[0] = a, o[1] = b;
  }
}

// Block per token: dye rows for its K slots and dweight (block reductions).
__global__ void combine_bwd_kernel(bf16* dye, float* dweight, const bf16* dout, const bf16* ye,
                                   const int32_t* slot_pos, const float* weight, int K, int64_t d) {
  __shared__ float red[kRouterMaxTopk][8];
  const int64_t t = blockIdx.x;
  float dots[kRouterMaxTopk];
  for (int k = 0; k < kRouterMaxTopk; ++k) dots[k] = 0.f;
  for (int64_t v = threadIdx.x; v < d / 8; v += blockDim.x) {
    float g[8];
    unpack8(reinterpret_cast<const uint4*>(dout + t * d)[v], g);
    for (int k = 0; k < K; ++k) {
      const int64_t p = slot_pos[t * K + k];
      const float w = weight ? weight[t * K + k] : 1.f;
      float y[8], o[8];
      unpack8(reinterpret_cast<const uint4*>(ye + p * d)[v], y);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dots[k] = fmaf(g[i], y[i], dots[k]);
        o[i] = w * g[i];
      }
      reinterpret_cast<uint4*>(dye + p * d)[v] = pack8(o);
    }
  }
  if (!dweight) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k = 0; k < K; ++k) {
    const float x = reduce::warp_sum(dots[k]);
    if (lane == 0) red[k][warp] = x;
  }
  __syncthreads();
  if (threadIdx.x < K) {
    float acc = 0.f;
    for (int w = 0; w < int(blockDim.x / 32); ++w) acc += red[threadIdx.x][w];
    dweight[t * K + threadIdx.x] = acc;
  }
}

constexpr int kWarpsPerBlock = 8;
unsigned warp_blocks(int64_t n) {
  return unsigned((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

void check_shape(const RouterShape& s) {
  TREX_CHECK(s.n_experts >= 1 && s.n_experts <= kRouterMaxExperts, "router (CUDA): {} experts, at most {}",
             s.n_experts, kRouterMaxExperts);
  TREX_CHECK(s.topk >= 1 && s.topk <= kRouterMaxTopk && s.topk <= s.n_experts,
             "router (CUDA): top-k {} out of range (1..{}, <= {} experts)", s.topk, kRouterMaxTopk,
             s.n_experts);
}

}  // namespace

void router_fwd(const RouterShape& s, const float* logits, const float* bias, const int32_t* tid2eid,
                int64_t vocab, const int32_t* token_ids, float* scores, int32_t* sel, float* weight,
                int32_t* status, cudaStream_t stream) {
  check_shape(s);
  TREX_CHECK(!s.hash || (tid2eid && token_ids), "router (CUDA): hash routing needs tid2eid and token ids");
  if (s.n_tok == 0) return;
  router_fwd_kernel<<<warp_blocks(s.n_tok), kWarpsPerBlock * 32, 0, stream>>>(
      s, logits, bias, tid2eid, vocab, token_ids, scores, sel, weight, status);
  TREX_CUDA_LAUNCHED();
}

void router_bwd(const RouterShape& s, const float* logits, const float* scores, const int32_t* sel,
                const float* dweight, const float* dscores_extra, float* dlogits, cudaStream_t stream) {
  check_shape(s);
  if (s.n_tok == 0) return;
  router_bwd_kernel<<<warp_blocks(s.n_tok), kWarpsPerBlock * 32, 0, stream>>>(s, logits, scores, sel, dweight,
                                                                              dscores_extra, dlogits);
  TREX_CUDA_LAUNCHED();
}

int64_t moe_route_plan_scratch(int64_t n_tok, int64_t topk, int64_t n_experts) {
  return std::max<int64_t>(1, (n_tok * topk + kChunk - 1) / kChunk) * n_experts;
}

void moe_route_plan(const int32_t* sel, int64_t n_tok, int64_t topk, int64_t n_experts, int32_t* order,
                    int32_t* slot_pos, int32_t* offsets, int32_t* scratch, cudaStream_t stream) {
  TREX_CHECK(n_experts >= 1 && n_experts <= 8192, "moe_route_plan: {} experts out of range", n_experts);
  const int64_t nk = n_tok * topk;
  TREX_CHECK(nk < (int64_t(1) << 31), "moe_route_plan: {} slots overflow int32", nk);
  const int E = int(n_experts);
  const int64_t n_chunks = std::max<int64_t>(1, (nk + kChunk - 1) / kChunk);
  const size_t smem = size_t(E) * 4;
  plan_count_kernel<<<unsigned(n_chunks), 256, smem, stream>>>(sel, nk, E, scratch);
  TREX_CUDA_LAUNCHED();
  plan_scan_kernel<<<1, 1024, smem, stream>>>(scratch, n_chunks, E, offsets);
  TREX_CUDA_LAUNCHED();
  plan_scatter_kernel<<<unsigned(n_chunks), 32, smem, stream>>>(sel, nk, E, scratch, offsets, order,
                                                                slot_pos);
  TREX_CUDA_LAUNCHED();
}

void moe_expert_counts(const int32_t* offsets, int64_t n_experts, int32_t* counts, cudaStream_t stream) {
  TREX_CHECK(n_experts >= 1 && n_experts <= 8192, "moe_expert_counts: {} experts out of range", n_experts);
  expert_counts_kernel<<<unsigned((n_experts + 255) / 256), 256, 0, stream>>>(offsets, int(n_experts), counts);
  TREX_CUDA_LAUNCHED();
}

void moe_gather(bf16* xe, const bf16* u, const int32_t* order, int64_t n_tok, int64_t topk, int64_t d,
                cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "moe_gather: d = {} must be a multiple of 8", d);
  if (n_tok * topk == 0) return;
  gather_kernel<<<unsigned(n_tok * topk), 128, 0, stream>>>(xe, u, order, int(topk), d);
  TREX_CUDA_LAUNCHED();
}

void rows_gather(bf16* dst, const bf16* src, const int32_t* idx, int64_t n, int64_t d, cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "rows_gather: d = {} must be a multiple of 8", d);
  if (n == 0) return;
  rows_permute_kernel<true><<<unsigned(n), 128, 0, stream>>>(dst, src, idx, d);
  TREX_CUDA_LAUNCHED();
}

void rows_scatter(bf16* dst, const bf16* src, const int32_t* idx, int64_t n, int64_t d, cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "rows_scatter: d = {} must be a multiple of 8", d);
  if (n == 0) return;
  rows_permute_kernel<false><<<unsigned(n), 128, 0, stream>>>(dst, src, idx, d);
  TREX_CUDA_LAUNCHED();
}

void moe_gather_bwd(float* du, const bf16* dxe, const int32_t* slot_pos, int64_t n_tok, int64_t topk,
                    int64_t d, cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "moe_gather_bwd: d = {} must be a multiple of 8", d);
  if (n_tok == 0) return;
  gather_bwd_kernel<<<unsigned(n_tok), 128, 0, stream>>>(du, dxe, slot_pos, int(topk), d);
  TREX_CUDA_LAUNCHED();
}

void moe_combine(bf16* out, const bf16* ye, const int32_t* slot_pos, const float* weight, const bf16* add,
                 int64_t n_tok, int64_t topk, int64_t d, cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "moe_combine: d = {} must be a multiple of 8", d);
  if (n_tok == 0) return;
  combine_kernel<<<unsigned(n_tok), 128, 0, stream>>>(out, ye, slot_pos, weight, add, int(topk), d);
  TREX_CUDA_LAUNCHED();
}

void moe_combine_accumulate(float* out, const bf16* ye, const int32_t* slot_pos, const float* weight,
                            int64_t n_tok, int64_t topk, int64_t d, cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "moe_combine_accumulate: d = {} must be a multiple of 8", d);
  if (n_tok == 0) return;
  combine_accumulate_kernel<<<unsigned(n_tok), 128, 0, stream>>>(out, ye, slot_pos, weight, int(topk), d);
  TREX_CUDA_LAUNCHED();
}

void moe_combine_bwd(bf16* dye, float* dweight, const bf16* dout, const bf16* ye, const int32_t* slot_pos,
                     const float* weight, int64_t n_tok, int64_t topk, int64_t d, cudaStream_t stream) {
  TREX_CHECK(d % 8 == 0, "moe_combine_bwd: d = {} must be a multiple of 8", d);
  TREX_CHECK(topk <= kRouterMaxTopk, "moe_combine_bwd: top-k {} > {}", topk, kRouterMaxTopk);
  if (n_tok == 0) return;
  combine_bwd_kernel<<<unsigned(n_tok), 256, 0, stream>>>(dye, dweight, dout, ye, slot_pos, weight, int(topk),
                                                          d);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
