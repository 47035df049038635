#include "kernels/cuda/attention_sparse.h"

#include "kernels/cuda/attention_dkv_reduce.h"
#include "kernels/cuda/attention_keys.cuh"
#include "kernels/cuda/attention_sparse_mma.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/vec_io.cuh"

namespace trex::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerWarp = kSparseAttnHeadsPerBlock / kWarps;  // 2
constexpr int kTile = 32;                                         // keys per tile: one per lane
constexpr int kPad = 8;  // bf16 padding per smem key row: lane j reading row j at one column hits other banks

static_assert(kHeadsPerWarp * kWarps == kSparseAttnHeadsPerBlock,
              "heads per block must split over the warps");

using vec::unpack8;

using reduce::warp_max;
using reduce::warp_sum;

using attn_keys::KeyList;
using attn_keys::key_list;

// Row index of key j: >= 0 is a kv row (window) or, with is_cmp, a compressed entry; -1 = no key.
__device__ inline int64_t key_row(const KeyList& l, int64_t j, bool& is_cmp) {
  is_cmp = false;
  if (j >= l.size()) return -1;
  if (j < l.n_win) return l.win_begin + j;
  is_cmp = true;
  const int64_t s = j - l.n_win;
  return l.sel ? l.sel[s] : l.cmp_begin + s;
}

// Loads the tile's key rows into smem (zeros for missing keys) and leaves each row's source in rows[]
// (row index, with bit 62 set for compressed entries; -1 = none).
template <int C>
__device__ inline void load_tile(const KeyList& l, int64_t j0, const bf16* kv, const bf16* cmp, bf16* ks,
                                 int64_t* rows) {
  if (threadIdx.x < kTile) {
    bool is_cmp;
    const int64_t r = key_row(l, j0 + threadIdx.x, is_cmp);
    rows[threadIdx.x] = r < 0 ? -1 : (is_cmp ? (r | (int64_t(1) << 62)) : r);
  }
  __syncthreads();
  constexpr int kVecPerRow = C / 8;
  for (int idx = threadIdx.x; idx < kTile * kVecPerRow; idx += kThreads) {
    const int j = idx / kVecPerRow, v = idx % kVecPerRow;
    const int64_t r = rows[j];
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r >= 0) {
      const bool is_cmp = (r >> 62) & 1;
      const int64_t row = r & ~(int64_t(1) << 62);
      const bf16* src = (is_cmp ? cmp : kv) + row * C;
      val = reinterpret_cast<const uint4*>(src)[v];
    }
    *reinterpret_cast<uint4*>(ks + j * (C + kPad) + v * 8) = val;
  }
  __syncthreads();
}

// grid (N, ceil(H / 16)), 256 threads. Warp w owns heads h0 + 2w, h0 + 2w + 1; in the score phase lane j owns
// key j of the tile, in the value phase lane l owns dims [l*C/32, (l+1)*C/32).
template <int C>
__global__ void __launch_bounds__(kThreads)
    sparse_attn_fwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t H,
                           SparseKeySets keys, bf16* o, float* lse, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);                                       // [kTile][C + kPad]
  bf16* qs = ks + kTile * (C + kPad);                                             // [16][C]
  int64_t* rows = reinterpret_cast<int64_t*>(qs + kSparseAttnHeadsPerBlock * C);  // [kTile]
  constexpr int kDims = C / 32;
  static_assert(kDims % 8 == 0, "a lane's dims are read as 16-byte vectors");

  const int64_t i = blockIdx.x;
  const int64_t h0 = int64_t(blockIdx.y) * kSparseAttnHeadsPerBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_heads = int(min(int64_t(kSparseAttnHeadsPerBlock), H - h0));
  for (int idx = threadIdx.x; idx < kSparseAttnHeadsPerBlock * C / 8; idx += kThreads) {
    const int hh = idx / (C / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (hh < n_heads) v = reinterpret_cast<const uint4*>(q + ((i * H + h0 + hh) * C))[idx % (C / 8)];
    reinterpret_cast<uint4*>(qs)[idx] = v;
  }
  const KeyList l = key_list(keys, i);

  float m[kHeadsPerWarp], sum[kHeadsPerWarp], acc[kHeadsPerWarp][kDims];
#pragma unroll
  for (int a = 0; a < kHeadsPerWarp; ++a) {
    const int hh = warp * kHeadsPerWarp + a;
    m[a] = hh < n_heads ? sink[h0 + hh] : 0.f;  // the sink starts the running softmax: exp(sink - m) = 1
    sum[a] = 1.f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) acc[a][d] = 0.f;
  }

  for (int64_t j0 = 0; j0 < l.size(); j0 += kTile) {
    load_tile<C>(l, j0, kv, cmp, ks, rows);
    // Scores: lane = key.
    float s[kHeadsPerWarp];
#pragma unroll
    for (int a = 0; a < kHeadsPerWarp; ++a) s[a] = 0.f;
    const bf16* krow = ks + lane * (C + kPad);
#pragma unroll 4
    for (int d = 0; d < C; d += 8) {
      float kf[8];
      unpack8(*reinterpret_cast<const uint4*>(krow + d), kf);
#pragma unroll
      for (int a = 0; a < kHeadsPerWarp; ++a) {
        float qf[8];
        unpack8(*reinterpret_cast<const uint4*>(qs + (warp * kHeadsPerWarp + a) * C + d), qf);
#pragma unroll
        for (int e = 0; e < 8; ++e) s[a] = fmaf(qf[e], kf[e], s[a]);
      }
    }
    const bool valid = rows[lane] >= 0;
    float p[kHeadsPerWarp];
#pragma unroll
    for (int a = 0; a < kHeadsPerWarp; ++a) {
      const float z = valid ? s[a] * scale : -INFINITY;
      const float m_new = fmaxf(m[a], warp_max(z));
      p[a] = valid ? __expf(z - m_new) : 0.f;
      const float alpha = __expf(m[a] - m_new);
      sum[a] = sum[a] * alpha + warp_sum(p[a]);
      m[a] = m_new;
#pragma unroll
      for (int d = 0; d < kDims; ++d) acc[a][d] *= alpha;
    }
    // Values: lane = dims.
    const int jn = int(min(int64_t(kTile), l.size() - j0));
    for (int j = 0; j < jn; ++j) {
      float pj[kHeadsPerWarp];
#pragma unroll
      for (int a = 0; a < kHeadsPerWarp; ++a) pj[a] = __shfl_sync(0xffffffffu, p[a], j);
      const bf16* kr = ks + j * (C + kPad) + lane * kDims;
#pragma unroll
      for (int d = 0; d < kDims; d += 8) {
        float kf[8];
        unpack8(*reinterpret_cast<const uint4*>(kr + d), kf);
#pragma unroll
        for (int a = 0; a < kHeadsPerWarp; ++a)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[a][d + e] = fmaf(pj[a], kf[e], acc[a][d + e]);
      }
    }
    __syncthreads();  // the next tile overwrites ks
  }
#pragma unroll
  for (int a = 0; a < kHeadsPerWarp; ++a) {
    const int hh = warp * kHeadsPerWarp + a;
    if (hh >= n_heads) continue;
    const int64_t row = i * H + h0 + hh;
    const float inv = 1.f / sum[a];
    bf16* out = o + row * C + lane * kDims;
#pragma unroll
    for (int d = 0; d < kDims; d += 2)
      *reinterpret_cast<__nv_bfloat162*>(out + d) =
          __floats2bfloat162_rn(acc[a][d] * inv, acc[a][d + 1] * inv);
    if (lane == 0) lse[row] = m[a] + logf(sum[a]);
  }
}

// Backward, same decomposition. Per tile: p and dz per (head, key) go to smem, then dq (lane = dims, in
// registers) and the tile's dK + dV rows (summed over the block's heads), stored to the block's partial rows for
// the fixed-order reduction (attention_dkv_reduce.h).
template <int C>
__global__ void __launch_bounds__(kThreads)
    sparse_attn_bwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t H,
                           SparseKeySets keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq,
                           dkv_reduce::PartOut po, float* dsink_part, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);                                            // [kTile][C + kPad]
  bf16* qs = ks + kTile * (C + kPad);                                                  // [16][C]
  bf16* dos = qs + kSparseAttnHeadsPerBlock * C;                                       // [16][C]
  float* ps = reinterpret_cast<float*>(dos + kSparseAttnHeadsPerBlock * C);            // [16][kTile]
  float* dzs = ps + kSparseAttnHeadsPerBlock * kTile;                                  // [16][kTile]
  int64_t* rows = reinterpret_cast<int64_t*>(dzs + kSparseAttnHeadsPerBlock * kTile);  // [kTile]
  constexpr int kDims = C / 32;

  const int64_t i = po.u0 + blockIdx.x;
  const int64_t h0 = int64_t(blockIdx.y) * kSparseAttnHeadsPerBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_heads = int(min(int64_t(kSparseAttnHeadsPerBlock), H - h0));
  for (int idx = threadIdx.x; idx < kSparseAttnHeadsPerBlock * C / 8; idx += kThreads) {
    const int hh = idx / (C / 8);
    uint4 vq = make_uint4(0, 0, 0, 0), vd = make_uint4(0, 0, 0, 0);
    if (hh < n_heads) {
      vq = reinterpret_cast<const uint4*>(q + ((i * H + h0 + hh) * C))[idx % (C / 8)];
      vd = reinterpret_cast<const uint4*>(do_ + ((i * H + h0 + hh) * C))[idx % (C / 8)];
    }
    reinterpret_cast<uint4*>(qs)[idx] = vq;
    reinterpret_cast<uint4*>(dos)[idx] = vd;
  }
  const KeyList l = key_list(keys, i);

  // D = dO . O and the row's lse per head; the sink's gradient share.
  float Dh[kHeadsPerWarp], L[kHeadsPerWarp], dqa[kHeadsPerWarp][kDims];
#pragma unroll
  for (int a = 0; a < kHeadsPerWarp; ++a) {
    const int hh = warp * kHeadsPerWarp + a;
    Dh[a] = 0.f;
    L[a] = 0.f;
#pragma unroll
    for (int d = 0; d < kDims; ++d) dqa[a][d] = 0.f;
    if (hh < n_heads) {
      const int64_t row = i * H + h0 + hh;
      const bf16* orow = o + row * C + lane * kDims;
      const bf16* drow = do_ + row * C + lane * kDims;
      float part = 0.f;
#pragma unroll
      for (int d = 0; d < kDims; d += 8) {
        float of[8], df[8];
        unpack8(*reinterpret_cast<const uint4*>(orow + d), of);
        unpack8(*reinterpret_cast<const uint4*>(drow + d), df);
#pragma unroll
        for (int e = 0; e < 8; ++e) part = fmaf(of[e], df[e], part);
      }
      Dh[a] = warp_sum(part);
      L[a] = lse[row];
      if (lane == 0) dsink_part[row] = -__expf(sink[h0 + hh] - L[a]) * Dh[a];
    }
  }

  for (int64_t j0 = 0; j0 < l.size(); j0 += kTile) {
    load_tile<C>(l, j0, kv, cmp, ks, rows);
    float s[kHeadsPerWarp], dp[kHeadsPerWarp];
#pragma unroll
    for (int a = 0; a < kHeadsPerWarp; ++a) s[a] = dp[a] = 0.f;
    const bf16* krow = ks + lane * (C + kPad);
#pragma unroll 2
    for (int d = 0; d < C; d += 8) {
      float kf[8];
      unpack8(*reinterpret_cast<const uint4*>(krow + d), kf);
#pragma unroll
      for (int a = 0; a < kHeadsPerWarp; ++a) {
        float qf[8], df[8];
        unpack8(*reinterpret_cast<const uint4*>(qs + (warp * kHeadsPerWarp + a) * C + d), qf);
        unpack8(*reinterpret_cast<const uint4*>(dos + (warp * kHeadsPerWarp + a) * C + d), df);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s[a] = fmaf(qf[e], kf[e], s[a]);
          dp[a] = fmaf(df[e], kf[e], dp[a]);
        }
      }
    }
    const bool valid = rows[lane] >= 0;
    float dz[kHeadsPerWarp];
#pragma unroll
    for (int a = 0; a < kHeadsPerWarp; ++a) {
      const int hh = warp * kHeadsPerWarp + a;
      const float p = (valid && hh < n_heads) ? __expf(s[a] * scale - L[a]) : 0.f;
      dz[a] = p * (dp[a] - Dh[a]) * scale;
      ps[hh * kTile + lane] = p;
      dzs[hh * kTile + lane] = dz[a];
    }
    // dq += dz_j k_j (lane = dims).
    const int jn = int(min(int64_t(kTile), l.size() - j0));
    for (int j = 0; j < jn; ++j) {
      float dzj[kHeadsPerWarp];
#pragma unroll
      for (int a = 0; a < kHeadsPerWarp; ++a) dzj[a] = __shfl_sync(0xffffffffu, dz[a], j);
      const bf16* kr = ks + j * (C + kPad) + lane * kDims;
#pragma unroll
      for (int d = 0; d < kDims; d += 8) {
        float kf[8];
        unpack8(*reinterpret_cast<const uint4*>(kr + d), kf);
#pragma unroll
        for (int a = 0; a < kHeadsPerWarp; ++a)
#pragma unroll
          for (int e = 0; e < 8; ++e) dqa[a][d + e] = fmaf(dzj[a], kf[e], dqa[a][d + e]);
      }
    }
    __syncthreads();  // ps / dzs complete
    // dK + dV of the tile's rows: sum over the block's heads of dz * q + p * do, 4 dims per item.
    constexpr int kGroups = C / 4;
    for (int idx = threadIdx.x; idx < jn * kGroups; idx += kThreads) {
      const int j = idx / kGroups, g = idx % kGroups;
      const int64_t r = rows[j];
      if (r < 0) continue;
      float4 accv = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int hh = 0; hh < n_heads; ++hh) {
        const float pj = ps[hh * kTile + j], dzj = dzs[hh * kTile + j];
        const __nv_bfloat162* qv = reinterpret_cast<const __nv_bfloat162*>(qs + hh * C + 4 * g);
        const __nv_bfloat162* dv = reinterpret_cast<const __nv_bfloat162*>(dos + hh * C + 4 * g);
        const float2 q01 = __bfloat1622float2(qv[0]), q23 = __bfloat1622float2(qv[1]);
        const float2 d01 = __bfloat1622float2(dv[0]), d23 = __bfloat1622float2(dv[1]);
        accv.x += dzj * q01.x + pj * d01.x;
        accv.y += dzj * q01.y + pj * d01.y;
        accv.z += dzj * q23.x + pj * d23.x;
        accv.w += dzj * q23.y + pj * d23.y;
      }
      float* dst =
          po.part + ((int64_t(blockIdx.x) * po.n_slots + j0 + j) * gridDim.y + blockIdx.y) * C + 4 * g;
      *reinterpret_cast<float4*>(dst) = accv;
    }
    __syncthreads();  // the next tile overwrites ks, ps, dzs
  }
#pragma unroll
  for (int a = 0; a < kHeadsPerWarp; ++a) {
    const int hh = warp * kHeadsPerWarp + a;
    if (hh >= n_heads) continue;
    bf16* out = dq + (i * H + h0 + hh) * C + lane * kDims;
#pragma unroll
    for (int d = 0; d < kDims; d += 2)
      *reinterpret_cast<__nv_bfloat162*>(out + d) = __floats2bfloat162_rn(dqa[a][d], dqa[a][d + 1]);
  }
}

// dsink[h] += sum_i part[i, h], one block per head, in a fixed order.
__global__ void dsink_reduce_kernel(float* dsink, const float* part, int64_t N, int64_t H) {
  __shared__ float red[kThreads];
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < N; i += kThreads) acc += part[i * H + blockIdx.x];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsink[blockIdx.x] += red[0];
}

size_t fwd_smem(int C) {
  return size_t(kTile) * (C + kPad) * 2 + size_t(kSparseAttnHeadsPerBlock) * C * 2 + kTile * 8;
}
size_t bwd_smem(int C) {
  return size_t(kTile) * (C + kPad) * 2 + 2 * size_t(kSparseAttnHeadsPerBlock) * C * 2 +
         2 * size_t(kSparseAttnHeadsPerBlock) * kTile * 4 + kTile * 8;
}

template <int C>
void launch_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  const size_t smem = fwd_smem(C);
  TREX_CUDA(cudaFuncSetAttribute(sparse_attn_fwd_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem)));
  dim3 grid(unsigned(N), unsigned((H + kSparseAttnHeadsPerBlock - 1) / kSparseAttnHeadsPerBlock));
  sparse_attn_fwd_kernel<C>
      <<<grid, kThreads, smem, s>>>(q, kv, cmp, sink, H, keys, o, lse, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}

// Queries [po.u0, po.u0 + n_units).
template <int C>
void launch_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t H,
                const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq,
                const dkv_reduce::PartOut& po, int64_t n_units, float* sink_part, cudaStream_t s) {
  const size_t smem = bwd_smem(C);
  TREX_CUDA(cudaFuncSetAttribute(sparse_attn_bwd_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem)));
  dim3 grid(unsigned(n_units), unsigned((H + kSparseAttnHeadsPerBlock - 1) / kSparseAttnHeadsPerBlock));
  sparse_attn_bwd_kernel<C><<<grid, kThreads, smem, s>>>(q, kv, cmp, sink, H, keys, o, lse, do_, dq, po,
                                                         sink_part, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}

void check_args(int64_t N, int64_t H, int64_t c, const SparseKeySets& keys) {
  TREX_CHECK(c == 256 || c == 512, "sparse attention (CUDA): head dim c = {} unsupported (256 or 512)", c);
  TREX_CHECK(keys.win_begin, "sparse attention (CUDA): win_begin is required");
  TREX_CHECK(!keys.cmp_sel || keys.k_sel > 0, "sparse attention (CUDA): cmp_sel given with k_sel = {}",
             keys.k_sel);
  TREX_CHECK(N < (int64_t(1) << 31) && H > 0, "sparse attention (CUDA): N = {}, H = {} out of range", N, H);
}

}  // namespace

void sparse_attention_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N,
                          int64_t H, int64_t c, const SparseKeySets& keys, bf16* o, float* lse,
                          cudaStream_t s, SparseAttnKernel kernel) {
  if (N == 0) return;
  check_args(N, H, c, keys);
  if (kernel != SparseAttnKernel::CudaCore && mma_attn::supported(c))
    return mma_attn::fwd(q, kv, cmp, sink, N, H, c, keys, o, lse, s);  // the kernel for the shape (H, key kind)
  switch (c) {
    case 256:
      return launch_fwd<256>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    default:
      return launch_fwd<512>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  }
}

namespace {

// The contributors of the backward the call runs (attention_dkv_reduce.h): the tensor-core dispatch's units, or
// one query x 16 heads per block on CUDA cores.
dkv_reduce::Units bwd_units(int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys,
                            SparseAttnKernel kernel) {
  dkv_reduce::Units u;
  u.N = N, u.E = E, u.H = H, u.c = c;
  if (kernel != SparseAttnKernel::CudaCore && mma_attn::supported(c)) {
    const mma_attn::BwdUnits b = mma_attn::bwd_units(H, keys);
    u.qb = b.qb, u.G = b.G;
  } else {
    u.qb = 1, u.G = (H + kSparseAttnHeadsPerBlock - 1) / kSparseAttnHeadsPerBlock;
  }
  u.n_slots = dkv_reduce::slots_bound(keys, E, u.qb);
  return u;
}

}  // namespace

int64_t sparse_attention_bwd_scratch(int64_t N, int64_t E, int64_t H, int64_t c, const SparseKeySets& keys,
                                     SparseAttnKernel kernel, int64_t partial_budget, SparseAttnBwdOrder order) {
  if (N == 0) return 1;
  if (order == SparseAttnBwdOrder::Atomic && kernel != SparseAttnKernel::CudaCore && mma_attn::supported(c))
    return N * H;  // the sink partials only
  const dkv_reduce::Plan p = dkv_reduce::make_plan(bwd_units(N, E, H, c, keys, kernel), partial_budget);
  return int64_t((p.bytes + sizeof(float) - 1) / sizeof(float));
}

void sparse_attention_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N,
                          int64_t E, int64_t H, int64_t c, const SparseKeySets& keys, const bf16* o,
                          const float* lse, const bf16* do_, bf16* dq, float* dkv, float* dcmp, float* dsink,
                          float* scratch, cudaStream_t s, SparseAttnKernel kernel, int64_t partial_budget,
                          SparseAttnBwdOrder order) {
  if (N == 0) return;
  check_args(N, H, c, keys);
  TREX_CHECK(E == 0 || dcmp, "sparse attention bwd (CUDA): {} compressed entries but dcmp is null", E);
  if (order == SparseAttnBwdOrder::Atomic && kernel != SparseAttnKernel::CudaCore && mma_attn::supported(c)) {
    mma_attn::bwd_atomic(q, kv, cmp, sink, N, H, c, keys, o, lse, do_, dq, dkv, dcmp, scratch, s);
    dsink_reduce_kernel<<<unsigned(H), kThreads, 0, s>>>(dsink, scratch, N, H);
    TREX_CUDA_LAUNCHED();
    return;
  }
  const dkv_reduce::Plan plan = dkv_reduce::make_plan(bwd_units(N, E, H, c, keys, kernel), partial_budget);
  float* sink_part = dkv_reduce::sink_part(plan, scratch);
  const bool tensor = kernel != SparseAttnKernel::CudaCore && mma_attn::supported(c);
  dkv_reduce::run(plan, keys, scratch, dkv, dcmp, s, [&](const dkv_reduce::PartOut& po, int64_t n_units) {
    if (tensor) return mma_attn::bwd(q, kv, cmp, sink, N, H, c, keys, o, lse, do_, dq, sink_part, po, n_units, s);
    if (c == 256) return launch_bwd<256>(q, kv, cmp, sink, H, keys, o, lse, do_, dq, po, n_units, sink_part, s);
    return launch_bwd<512>(q, kv, cmp, sink, H, keys, o, lse, do_, dq, po, n_units, sink_part, s);
  });
  dsink_reduce_kernel<<<unsigned(H), kThreads, 0, s>>>(dsink, sink_part, N, H);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda
