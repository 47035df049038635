// Tensor-core (bf16 in, fp32 accumulate) sparse MQA kernels with sinks: the templates behind
// trex::cuda::mma_attn::{fwd,bwd} (attention_sparse_mma.h; attention_sparse.h has the contract). Internal:
// included by attention_sparse_mma.cu, which instantiates the configurations the product dispatches to, and by
// dev/attention/sparse_variants.cu, which instantiates the measured alternatives (numbered versions) from the
// same templates. Three kernel families:
//   bwd_kernel      mma.sync m16n8k16, one block = one query x R = 16 MT heads (2 MT warps), or (MQ) floor(R / H)
//                   consecutive queries x H heads over the union of their keys; 32-key cp.async tiles, key sources
//                   prefetched two tiles ahead when PF;
//   sd_*_kernel     split dims: one query x 16 MT heads, 4 warps per 16 heads each owning c / 4 dims;
//   wg_fwd_kernel   sm_90a wgmma, one query x 64 heads, two warpgroups of c / 2 output dims.
// The backward kernels with DET store each key slot's dK + dV (summed over the block's heads) to the block's partial
// rows, which attention_dkv_reduce.h sums in a fixed order (the product); without it they add them to dkv / dcmp
// with fp32 atomics (the versions dev/attention keeps).
// Fragment layouts are those of PTX mma.m16n8k16 (row.col): g = lane / 4 is the row (and B's column), t = lane % 4.
#pragma once
#include <algorithm>

#include "kernels/cuda/attention_dkv_reduce.h"
#include "kernels/cuda/attention_keys.cuh"
#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace trex::cuda::mma_attn {

using namespace ptx;

constexpr int kKT = 32;  // keys per tile of bwd_kernel (load_tile also serves 64-key tiles)
constexpr int kPad = 8;  // bf16 per smem row: a 16-byte shift so the 8 rows of an ldmatrix hit distinct banks

using attn_keys::KeyList;
using attn_keys::key_list;
using attn_keys::union_key_list;

// Whether key j of a union list belongs to query qi (= i0 + qi) of the block (qb: that query's own sets).
struct QuerySets {
  int64_t win_begin, cmp_begin, cmp_end;
};
__device__ inline bool owns_key(const KeyList& l, const SparseKeySets& k, const QuerySets& qs, int64_t i, int qi,
                                int64_t j) {
  if (j < l.n_win) {
    const int64_t r = l.win_begin + j;
    return r >= qs.win_begin && r <= i;
  }
  const int64_t s = j - l.n_win;
  if (k.cmp_sel) return s / k.k_sel == qi;
  const int64_t e = l.cmp_begin + s;
  return e >= qs.cmp_begin && e < qs.cmp_end;
}

// Source row of key j: kv row, or (bit 62 set) a compressed entry; -1 = no key (past the end or an empty slot).
constexpr int64_t kCmpBit = int64_t(1) << 62;
__device__ inline int64_t key_src(const KeyList& l, int64_t j) {
  if (j >= l.size()) return -1;
  if (j < l.n_win) return l.win_begin + j;
  const int64_t s = j - l.n_win;
  const int64_t e = l.sel ? l.sel[s] : l.cmp_begin + s;
  return e < 0 ? -1 : (e | kCmpBit);
}
__device__ inline const bf16* src_ptr(int64_t src, const bf16* kv, const bf16* cmp, int C) {
  return (src & kCmpBit) ? cmp + (src & ~kCmpBit) * C : kv + src * C;
}

// Issues the cp.async copies of key tile j0 into ks ([KT][C + kPad]); missing keys become zero rows. The
// thread that copies a row's first chunk records its source in srcs[] (read after the wait + barrier).
template <int C, int T, int KT = kKT>
__device__ inline void load_tile(const KeyList& l, int64_t j0, const bf16* kv, const bf16* cmp, bf16* ks,
                                 int64_t* srcs) {
  constexpr int kChunks = C / 8;
  static_assert((KT * kChunks) % T == 0, "tile chunks must split over the threads");
#pragma unroll
  for (int it = 0; it < KT * kChunks / T; ++it) {
    const int idx = threadIdx.x + it * T;
    const int j = idx / kChunks, v = idx % kChunks;
    const int64_t src = key_src(l, j0 + j);
    const bf16* g = src >= 0 ? src_ptr(src, kv, cmp, C) + v * 8 : kv;
    cp_async16(ks + j * (C + kPad) + v * 8, g, src >= 0);
    if (v == 0) srcs[j] = src;
  }
}

// Copies R rows of a [*, H, C] tensor (heads h0..h0+R-1 of query i) into xs ([R][C + kPad]); rows past H are 0.
template <int C, int T, int R>
__device__ inline void load_heads(const bf16* x, int64_t i, int64_t H, int64_t h0, int n_heads, bf16* xs) {
  constexpr int kChunks = C / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += T) {
    const int r = idx / kChunks, v = idx % kChunks;
    const bool ok = r < n_heads;
    const bf16* g = ok ? x + ((i * H + h0 + r) * C) + v * 8 : x;
    cp_async16(xs + r * (C + kPad) + v * 8, g, ok);
  }
}

// Prefetched key sources (PF): lane r of every warp holds the source (key_src) of key r (and
// r + 32 for 64-key tiles) of a tile issued later, loaded two tiles ahead, so issuing a tile's cp.async never
// waits on a global load of the CSA selection. Same copies and srcs[] as load_tile.
template <int C, int T, int KT>
__device__ inline void load_tile_pf(const int64_t (&src)[KT / 32], const bf16* kv, const bf16* cmp, bf16* ks,
                                    int64_t* srcs) {
  constexpr int kChunks = C / 8;
  static_assert((KT * kChunks) % T == 0 && (KT == 32 || KT == 64), "prefetched tile load");
#pragma unroll
  for (int it = 0; it < KT * kChunks / T; ++it) {
    const int idx = threadIdx.x + it * T;
    const int j = idx / kChunks, v = idx % kChunks;
    int64_t sj = __shfl_sync(0xffffffffu, src[0], j % 32);
    if constexpr (KT == 64) {
      const int64_t s1 = __shfl_sync(0xffffffffu, src[KT / 32 - 1], j % 32);
      sj = j < 32 ? sj : s1;
    }
    cp_async16(ks + j * (C + kPad) + v * 8, sj >= 0 ? src_ptr(sj, kv, cmp, C) + v * 8 : kv, sj >= 0);
    if (v == 0) srcs[j] = sj;
  }
}
template <int KT>
__device__ inline void key_srcs(const KeyList& l, int64_t j0, int64_t (&src)[KT / 32]) {
#pragma unroll
  for (int u = 0; u < KT / 32; ++u) src[u] = key_src(l, j0 + u * 32 + threadIdx.x % 32);
}


template <int C, int MT>
struct BwdSmem {
  static constexpr int R = 16 * MT;
  static constexpr size_t q = size_t(R) * (C + kPad) * 2;  // Q, then dO
  static constexpr size_t k = size_t(2) * kKT * (C + kPad) * 2;
  static constexpr size_t p = size_t(R) * (kKT + kPad) * 2;  // P, then dS
  static constexpr size_t srcs = size_t(2) * kKT * 8;
  static constexpr size_t stats = size_t(2) * R * 4;
  static constexpr size_t total = 2 * q + k + 2 * p + srcs + stats;
};

// Puts a 16 x 8 fp32 accumulator fragment into dst rows (row0 + g, row0 + g + 8), cols col0 + 2t: lanes t, t ^ 1
// swap halves so each issues one 16-byte access (even t: row g, cols 2t..2t+3; odd t: row g + 8). DET: a store
// into the block's own partial rows (attention_dkv_reduce.h); else a 16-byte fp32 atomic add into dkv / dcmp.
template <bool DET>
__device__ __forceinline__ void frag_out(const float (&a)[4], float* row_g, float* row_g8, int t) {
  const bool odd = t & 1;
  const float sx = odd ? a[0] : a[2], sy = odd ? a[1] : a[3];
  const float rx = __shfl_xor_sync(0xffffffffu, sx, 1), ry = __shfl_xor_sync(0xffffffffu, sy, 1);
  float* dst = odd ? (row_g8 ? row_g8 + 2 * (t - 1) : nullptr) : (row_g ? row_g + 2 * t : nullptr);
  if (!dst) return;
  const float4 v = odd ? make_float4(rx, ry, a[2], a[3]) : make_float4(a[0], a[1], rx, ry);
  if constexpr (DET)
    __stcs(reinterpret_cast<float4*>(dst), v);  // read once, by the reduction
  else
    atomicAdd(reinterpret_cast<float4*>(dst), v);
}

// Backward (FlashAttention-2 recomputation with the saved lse), per key tile:
//   warp (m-tile w / 2, keys 16 (w % 2) ..): S = Q K^T and dP = dO K^T share the key fragments; P = exp(S - lse),
//   dS = P (dP - D) / sqrt(c) (D = dO . O per head), both to smem as bf16;
//   dQ += dS K (warp w owns c / (2 MT) dims, in registers for the whole query);
//   dK + dV of the tile's rows = dS^T Q + P^T dO (M = 32 keys, N = 64-dim chunks round-robin over the warps,
//   K = the block's heads), stored to the block's partial rows (DET; attention_dkv_reduce.h sums them in a fixed
//   order) or added to dkv / dcmp with 16-byte fp32 atomics (the atomic versions of dev/attention).
// MQ: rows are the (query, head) pairs of qb consecutive queries over the union of their keys, each row masking
// the keys not its query's (masked P and dS are 0, so dQ rows and the dK + dV sums are those of the separate
// queries).
template <int C, int MT, bool MQ, bool PF = false, bool DET = false>
__global__ void __launch_bounds__(64 * MT)
    bwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int qb,
               SparseKeySets keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
               float* dcmp, float* dsink_part, float scale, dkv_reduce::PartOut po) {
  constexpr int T = 64 * MT, R = 16 * MT, W = 2 * MT, DW = C / W, kChunk = 64;
  using L = BwdSmem<C, MT>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = reinterpret_cast<bf16*>(smem + L::q);
  bf16* ks = reinterpret_cast<bf16*>(smem + 2 * L::q);
  bf16* ps = reinterpret_cast<bf16*>(smem + 2 * L::q + L::k);
  bf16* dss = reinterpret_cast<bf16*>(smem + 2 * L::q + L::k + L::p);
  int64_t* srcs = reinterpret_cast<int64_t*>(smem + 2 * L::q + L::k + 2 * L::p);
  float* lse_s = reinterpret_cast<float*>(smem + 2 * L::q + L::k + 2 * L::p + L::srcs);
  float* d_s = lse_s + R;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t unit = po.u0 + blockIdx.x;  // a query, or MQ: a block of qb queries
  const int64_t i = MQ ? unit * qb : unit;
  const int64_t h0 = MQ ? 0 : int64_t(blockIdx.y) * R;
  const int nq = MQ ? int(min(int64_t(qb), N - i)) : 1;
  const int n_heads = MQ ? int(nq * H) : int(min(int64_t(R), H - h0));  // rows in use
  const int64_t base_row = i * H + h0;
  const KeyList l = MQ ? union_key_list(keys, i, nq) : key_list(keys, i);
  const int n_tiles = int((l.size() + kKT - 1) / kKT);

  load_heads<C, T, R>(q, base_row, 1, 0, n_heads, qs);
  load_heads<C, T, R>(do_, base_row, 1, 0, n_heads, dos);
  int64_t pf_n[1];  // PF: sources of tile + 1
  if constexpr (PF) {
    int64_t pf0[1];
    key_srcs<kKT>(l, 0, pf0);
    key_srcs<kKT>(l, kKT, pf_n);
    load_tile_pf<C, T, kKT>(pf0, kv, cmp, ks, srcs);
  } else {
    load_tile<C, T>(l, 0, kv, cmp, ks, srcs);
  }
  cp_async_commit();
  {  // D = dO . O per head (4 threads per row), the row's lse, and the sink's gradient share.
    const int r = threadIdx.x / 4, part = threadIdx.x % 4;
    float D = 0.f;
    if (r < n_heads) {
      const uint4* ov = reinterpret_cast<const uint4*>(o + (base_row + r) * C + part * (C / 4));
      const uint4* dv = reinterpret_cast<const uint4*>(do_ + (base_row + r) * C + part * (C / 4));
#pragma unroll 4
      for (int v = 0; v < C / 32; ++v) {
        const uint4 a = ov[v], b = dv[v];
        const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
        const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 x = __bfloat1622float2(a2[e]), y = __bfloat1622float2(b2[e]);
          D = fmaf(x.x, y.x, fmaf(x.y, y.y, D));
        }
      }
    }
    D += __shfl_xor_sync(0xffffffffu, D, 1);
    D += __shfl_xor_sync(0xffffffffu, D, 2);
    if (part == 0) {
      if (r < n_heads) {
        const float L_r = lse[base_row + r];
        lse_s[r] = L_r;
        d_s[r] = D;
        dsink_part[base_row + r] = -__expf(sink[(h0 + r) % H] - L_r) * D;
      } else {
        lse_s[r] = INFINITY;  // padding rows: P = 0
        d_s[r] = 0.f;
      }
    }
  }

  float dqa[MT][DW / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < DW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqa[mt][n][e] = 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    bf16* kb = ks + buf * kKT * (C + kPad);
    const int64_t* src = srcs + buf * kKT;
    if constexpr (PF) {
      int64_t pf_nn[1];
      key_srcs<kKT>(l, int64_t(tile + 2) * kKT, pf_nn);
      if (tile + 1 < n_tiles) load_tile_pf<C, T, kKT>(pf_n, kv, cmp, ks + (buf ^ 1) * kKT * (C + kPad), srcs + (buf ^ 1) * kKT);
      pf_n[0] = pf_nn[0];
    } else if (tile + 1 < n_tiles) {
      load_tile<C, T>(l, int64_t(tile + 1) * kKT, kv, cmp, ks + (buf ^ 1) * kKT * (C + kPad), srcs + (buf ^ 1) * kKT);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    {  // S, dP -> P, dS (bf16) for (m-tile warp / 2, keys 16 (warp % 2) ..)
      const int mw = warp / 2, nh = warp % 2;
      float sacc[2][4] = {}, dpacc[2][4] = {};
      const bf16* qp = qs + (mw * 16 + lane % 16) * (C + kPad) + (lane / 16) * 8;
      const bf16* dp = dos + (mw * 16 + lane % 16) * (C + kPad) + (lane / 16) * 8;
      const bf16* bp = kb + (nh * 16 + (lane % 8) + (lane / 16) * 8) * (C + kPad) + ((lane / 8) % 2) * 8;
#pragma unroll 4
      for (int kd = 0; kd < C; kd += 16) {
        uint32_t a[4], b[4], d[4];
        ldsm_x4(b, bp + kd);
        ldsm_x4(a, qp + kd);
        ldsm_x4(d, dp + kd);
        mma(sacc[0], a, b[0], b[1]);
        mma(sacc[1], a, b[2], b[3]);
        mma(dpacc[0], d, b[0], b[1]);
        mma(dpacc[1], d, b[2], b[3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = mw * 16 + g + 8 * half;
        const float L_r = lse_s[r], D_r = d_s[r];
        const int qi = MQ ? min(r / int(H), nq - 1) : 0;
        QuerySets own{};
        if (MQ) {
          own.win_begin = keys.win_begin[i + qi];
          if (keys.cmp_begin) own.cmp_begin = keys.cmp_begin[i + qi], own.cmp_end = keys.cmp_end[i + qi];
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int col = nh * 16 + n * 8 + 2 * t;
          float p[2], dsv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            bool ok = src[col + e] >= 0;
            if (MQ) ok = ok && owns_key(l, keys, own, i + qi, qi, int64_t(tile) * kKT + col + e);
            p[e] = ok ? __expf(sacc[n][2 * half + e] * scale - L_r) : 0.f;
            dsv[e] = p[e] * (dpacc[n][2 * half + e] - D_r) * scale;
          }
          *reinterpret_cast<uint32_t*>(ps + r * (kKT + kPad) + col) = pack_bf16(p[0], p[1]);
          *reinterpret_cast<uint32_t*>(dss + r * (kKT + kPad) + col) = pack_bf16(dsv[0], dsv[1]);
        }
      }
    }
    __syncthreads();
    // dQ += dS K for dims [warp * DW, +DW).
#pragma unroll
    for (int kk = 0; kk < kKT; kk += 16) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4(a[mt], dss + (mt * 16 + lane % 16) * (kKT + kPad) + kk + (lane / 16) * 8);
      const bf16* vp = kb + (kk + (lane % 8) + ((lane / 8) % 2) * 8) * (C + kPad) + warp * DW + (lane / 16) * 8;
#pragma unroll
      for (int n = 0; n < DW / 8; n += 2) {
        uint32_t b[4];
        ldsm_x4_t(b, vp + n * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma(dqa[mt][n], a[mt], b[0], b[1]);
          mma(dqa[mt][n + 1], a[mt], b[2], b[3]);
        }
      }
    }
    // dK + dV rows of the tile: dS^T Q + P^T dO over the block's heads, 64-dim chunks.
    for (int ch = warp; ch < C / kChunk; ch += W) {
      float acc[2][kChunk / 8][4];
#pragma unroll
      for (int mk = 0; mk < 2; ++mk)
#pragma unroll
        for (int n = 0; n < kChunk / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mk][n][e] = 0.f;
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        const bf16* as = pass == 0 ? dss : ps;
        const bf16* bs = pass == 0 ? qs : dos;
#pragma unroll
        for (int kh = 0; kh < R; kh += 16) {
          uint32_t a[2][4];
#pragma unroll
          for (int mk = 0; mk < 2; ++mk)
            ldsm_x4_t(a[mk], as + (kh + (lane % 8) + (lane / 16) * 8) * (kKT + kPad) + mk * 16 + ((lane / 8) % 2) * 8);
          const bf16* bp = bs + (kh + (lane % 8) + ((lane / 8) % 2) * 8) * (C + kPad) + ch * kChunk + (lane / 16) * 8;
#pragma unroll
          for (int n = 0; n < kChunk / 8; n += 2) {
            uint32_t b[4];
            ldsm_x4_t(b, bp + n * 8);
#pragma unroll
            for (int mk = 0; mk < 2; ++mk) {
              mma(acc[mk][n], a[mk], b[0], b[1]);
              mma(acc[mk][n + 1], a[mk], b[2], b[3]);
            }
          }
        }
      }
#pragma unroll
      for (int mk = 0; mk < 2; ++mk) {
        const int64_t s0 = src[mk * 16 + g], s1 = src[mk * 16 + g + 8];
        float *r0, *r1;
        if constexpr (DET) {
          // The block's partial rows: slot j of block (x, y) at part + ((x * n_slots + j) * gridDim.y + y) * C (a
          // chunk's partials stay below 2^31 floats: 32-bit offsets).
          float* slot0 = po.part + ((blockIdx.x * uint32_t(po.n_slots) + uint32_t(tile * kKT + mk * 16 + g)) *
                                        gridDim.y + blockIdx.y) * uint32_t(C) + uint32_t(ch * kChunk);
          r0 = s0 < 0 ? nullptr : slot0;
          r1 = s1 < 0 ? nullptr : slot0 + 8 * gridDim.y * uint32_t(C);
        } else {
          r0 = s0 < 0 ? nullptr : ((s0 & kCmpBit) ? dcmp + (s0 & ~kCmpBit) * C : dkv + s0 * C) + ch * kChunk;
          r1 = s1 < 0 ? nullptr : ((s1 & kCmpBit) ? dcmp + (s1 & ~kCmpBit) * C : dkv + s1 * C) + ch * kChunk;
        }
#pragma unroll
        for (int n = 0; n < kChunk / 8; ++n)
          frag_out<DET>(acc[mk][n], r0 ? r0 + n * 8 : nullptr, r1 ? r1 + n * 8 : nullptr, t);
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this buffer; P / dS are rewritten
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + 8 * half;
      if (r >= n_heads) continue;
      bf16* out = dq + (base_row + r) * C + warp * DW + 2 * t;
#pragma unroll
      for (int n = 0; n < DW / 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(out + n * 8) =
            __floats2bfloat162_rn(dqa[mt][n][2 * half], dqa[mt][n][2 * half + 1]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Split-dims kernels (sd_fwd_kernel / sd_bwd_kernel): a block serves one query and MT m-tiles of 16
// heads with 4 warps per m-tile; warp (mt, d) owns the head dims [d c/4, (d+1) c/4). Per 32-key tile every warp
// computes the partial S (and dP) of its m-tile over its own dims (Q fragments in registers for MT = 1), the four
// partials of an m-tile are summed through shared memory in a fixed order (every warp of the m-tile gets the
// same fp32 S), and the softmax, P (registers, FA2's C -> A fragment reuse) and O += P V run per warp over its own
// dims: no cross-warp P exchange, 4 independent S accumulators per warp, 2 block barriers per tile. Each lane owns
// one key of the tile: its source row is fetched two tiles ahead, so issuing a tile's cp.async never waits on a
// global load. Key tiles and Q / dO are XOR-swizzled in shared memory (16-byte chunk c of row r at c ^ (r & 7))
// instead of padded, so the H = 16 forward fits 3 blocks per SM and the backward 2.
constexpr int kSdKT = 32;  // keys per tile: one per lane
constexpr float kLog2e = 1.4426950408889634f;

// Element offset of (row, 16-byte chunk) in a swizzled [rows][C] bf16 tile.
template <int C>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * C + ((chunk ^ (row & 7)) << 3);
}
// Float2 offset (in floats) of C-fragment columns 8 n + 2 t, row r of a [16][32] fp32 partial: the float2 index
// is XORed with 4 r mod 16 so the 16 lanes of a half warp (4 rows x 4 t) hit distinct banks.
__device__ __forceinline__ int part_off(int r, int n, int t) {
  return r * kSdKT + 2 * ((4 * n + t) ^ ((4 * r) & 15));
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Transposes an 8 x 8 bf16 block held as one register per lane in mma fragment layout (lane: row lane / 4,
// columns 2 (lane % 4) + {0, 1}).
__device__ __forceinline__ uint32_t movm_t(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Key source as one int: >= 0 kv row, <= -2 compressed entry -src - 2, -1 none (past the end or an empty slot).
__device__ __forceinline__ int key_src32(const KeyList& l, int64_t j) {
  if (j >= l.size()) return -1;
  if (j < l.n_win) return int(l.win_begin + j);
  const int64_t s = j - l.n_win;
  const int64_t e = l.sel ? l.sel[s] : l.cmp_begin + s;
  return e < 0 ? -1 : int(-e - 2);
}

// cp.async of a 32-key tile (lane r of every warp holds key r's source) into kb ([32][C] swizzled); coalesced:
// consecutive threads copy consecutive 16-byte chunks of one row. Missing keys become zero rows.
template <int C, int T>
__device__ __forceinline__ void sd_issue(int src_lane, bf16* kb, const bf16* kv, const bf16* cmp) {
  constexpr int kChunks = C / 8, kRows = T / kChunks;
  static_assert(T % kChunks == 0 && kSdKT % kRows == 0 && kChunks % 32 == 0, "split-dims tile load");
  const int ch = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
#pragma unroll
  for (int it = 0; it < kSdKT / kRows; ++it) {
    const int r = it * kRows + r0;
    const int src = __shfl_sync(0xffffffffu, src_lane, r);
    const bf16* g = src >= 0 ? kv + int64_t(src) * C : cmp + int64_t(-src - 2) * C;
    cp_async16(kb + swz<C>(r, ch), src == -1 ? kv : g + ch * 8, src != -1);
  }
}

// Rows h0 .. h0 + R - 1 of query i of a [N, H, C] tensor into xs ([R][C] swizzled; rows >= n_rows zero).
template <int C, int T, int R>
__device__ __forceinline__ void sd_load_rows(const bf16* x, int64_t row0, int n_rows, bf16* xs) {
  constexpr int kChunks = C / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += T) {
    const int r = idx / kChunks, ch = idx % kChunks;
    const bool ok = r < n_rows;
    cp_async16(xs + swz<C>(r, ch), ok ? x + (row0 + r) * C + ch * 8 : x, ok);
  }
}

template <int C, int MT>
struct SdFwdSmem {
  static constexpr bool kQReg = MT == 1;  // Q fragments in registers (else ldmatrix from shared memory)
  static constexpr size_t k = size_t(2) * kSdKT * C * 2;
  static constexpr size_t part = size_t(4 * MT) * 16 * kSdKT * 4;
  static constexpr size_t q = kQReg ? 0 : size_t(16 * MT) * C * 2;
  static constexpr size_t total = k + part + q;
};

// S partial of 16 rows x 32 keys over the warp's dims: 4 independent accumulators (n-tiles of 8 keys).
template <int C, int NKS, bool QREG>
__device__ __forceinline__ void sd_qk(float (&s)[4][4], const uint32_t (&qf)[QREG ? NKS : 1][4], const bf16* qs,
                                      int mrow0, const bf16* kb, int dim0, int lane) {
#pragma unroll
  for (int ks = 0; ks < NKS; ++ks) {
    const int c0 = (dim0 + ks * 16) / 8;
    uint32_t a[4];
    if constexpr (QREG) {
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = qf[ks][e];
    } else {
      ldsm_x4(a, qs + swz<C>(mrow0 + lane % 16, c0 + lane / 16));
    }
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t b[4];
      ldsm_x4(b, kb + swz<C>(np * 16 + (lane % 8) + (lane / 16) * 8, c0 + (lane / 8) % 2));
      mma(s[2 * np], a, b[0], b[1]);
      mma(s[2 * np + 1], a, b[2], b[3]);
    }
  }
}

template <int C, int MT>
__global__ void __launch_bounds__(128 * MT, MT == 1 ? 3 : MT == 2 ? 2 : 1)
    sd_fwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t H, SparseKeySets keys,
                  bf16* o, float* lse, float scale) {
  constexpr int T = 128 * MT, R = 16 * MT, DQ = C / 4, NKS = DQ / 16, ND = DQ / 8;
  using L = SdFwdSmem<C, MT>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  float* part = reinterpret_cast<float*>(smem + L::k);
  bf16* qs = reinterpret_cast<bf16*>(smem + L::k + L::part);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = warp / 4, dq = warp % 4, dim0 = dq * DQ;
  const int64_t i = blockIdx.x, h0 = int64_t(blockIdx.y) * R, row0 = i * H + h0;
  const int n_heads = int(min(int64_t(R), H - h0));
  const KeyList l = key_list(keys, i);
  const int n_tiles = int((l.size() + kSdKT - 1) / kSdKT);

  int src_c = key_src32(l, lane), src_n = key_src32(l, kSdKT + lane);
  sd_issue<C, T>(src_c, ks, kv, cmp);
  if constexpr (!L::kQReg) sd_load_rows<C, T, R>(q, row0, n_heads, qs);
  cp_async_commit();
  const int r_lo = mt * 16 + g, r_hi = r_lo + 8;
  uint32_t qf[L::kQReg ? NKS : 1][4];
  if constexpr (L::kQReg) {
#pragma unroll
    for (int kk = 0; kk < NKS; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = (e & 1) ? r_hi : r_lo, col = dim0 + kk * 16 + 2 * t + (e >= 2 ? 8 : 0);
        qf[kk][e] = r < n_heads ? *reinterpret_cast<const uint32_t*>(q + (row0 + r) * C + col) : 0u;
      }
  }
  const float sl2 = scale * kLog2e;
  float m0 = r_lo < n_heads ? sink[h0 + r_lo] * kLog2e : 0.f;  // the sink opens the softmax: exp2(m - m) = 1
  float m1 = r_hi < n_heads ? sink[h0 + r_hi] * kLog2e : 0.f;
  float l0 = t == 0 ? 1.f : 0.f, l1 = l0;  // per-thread partial row sums (the sink's 1 counted once per row)
  float acc[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int src_nn = key_src32(l, int64_t(tile + 2) * kSdKT + lane);  // consumed two iterations later
    cp_async_wait<0>();
    __syncthreads();  // tile in smem; every warp is past the previous tile (its buffer and the partials are free)
    const bf16* kb = ks + (tile & 1) * kSdKT * C;
    if (tile + 1 < n_tiles) sd_issue<C, T>(src_n, ks + ((tile + 1) & 1) * kSdKT * C, kv, cmp);
    cp_async_commit();
    const unsigned valid = __ballot_sync(0xffffffffu, src_c != -1);

    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
    sd_qk<C, NKS, L::kQReg>(s, qf, qs, mt * 16, kb, dim0, lane);
    float* pw = part + warp * 16 * kSdKT;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      *reinterpret_cast<float2*>(pw + part_off(g, n, t)) = make_float2(s[n][0], s[n][1]);
      *reinterpret_cast<float2*>(pw + part_off(g + 8, n, t)) = make_float2(s[n][2], s[n][3]);
    }
    __syncthreads();
    // Full S of the m-tile: the 4 partials in a fixed order (identical in the 4 warps).
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      float2 lo = make_float2(0.f, 0.f), hi = lo;
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const float* pd = part + (mt * 4 + d) * 16 * kSdKT;
        const float2 x = *reinterpret_cast<const float2*>(pd + part_off(g, n, t));
        const float2 y = *reinterpret_cast<const float2*>(pd + part_off(g + 8, n, t));
        lo.x += x.x, lo.y += x.y, hi.x += y.x, hi.y += y.y;
      }
      s[n][0] = lo.x, s[n][1] = lo.y, s[n][2] = hi.x, s[n][3] = hi.y;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = (valid >> (8 * n + 2 * t + (e & 1))) & 1u;
        s[n][e] = ok ? s[n][e] * sl2 : -INFINITY;
        if (e < 2) mx0 = fmaxf(mx0, s[n][e]);
        else mx1 = fmaxf(mx1, s[n][e]);
      }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float a0 = ex2(m0 - mn0), a1 = ex2(m1 - mn1);
    m0 = mn0, m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      s[n][0] = ex2(s[n][0] - mn0), s[n][1] = ex2(s[n][1] - mn0);
      s[n][2] = ex2(s[n][2] - mn1), s[n][3] = ex2(s[n][3] - mn1);
      sum0 += s[n][0] + s[n][1], sum1 += s[n][2] + s[n][3];
    }
    l0 = l0 * a0 + sum0, l1 = l1 * a1 + sum1;
#pragma unroll
    for (int n = 0; n < ND; ++n) acc[n][0] *= a0, acc[n][1] *= a0, acc[n][2] *= a1, acc[n][3] *= a1;
    // O += P V over the warp's dims (P's C fragments are the A fragments of the 16-key steps).
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int vr = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        uint32_t b[4];
        ldsm_x4_t(b, kb + swz<C>(vr, (dim0 + n * 8) / 8 + lane / 16));
        mma(acc[n], a, b[0], b[1]);
        mma(acc[n + 1], a, b[2], b[3]);
      }
    }
    src_c = src_n, src_n = src_nn;
  }
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    const int col = dim0 + n * 8 + 2 * t;
    if (r_lo < n_heads)
      *reinterpret_cast<__nv_bfloat162*>(o + (row0 + r_lo) * C + col) =
          __floats2bfloat162_rn(acc[n][0] * inv0, acc[n][1] * inv0);
    if (r_hi < n_heads)
      *reinterpret_cast<__nv_bfloat162*>(o + (row0 + r_hi) * C + col) =
          __floats2bfloat162_rn(acc[n][2] * inv1, acc[n][3] * inv1);
  }
  if (dq == 0 && t == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    if (r_lo < n_heads) lse[row0 + r_lo] = m0 * kLn2 + logf(l0);
    if (r_hi < n_heads) lse[row0 + r_hi] = m1 * kLn2 + logf(l1);
  }
}

template <int C, int MT>
struct SdBwdSmem {
  static constexpr int R = 16 * MT;
  static constexpr size_t k = size_t(2) * kSdKT * C * 2;
  static constexpr size_t qd = size_t(2) * R * C * 2;                // Q, dO of the block's heads (swizzled)
  static constexpr size_t part = size_t(2) * 4 * MT * 16 * kSdKT * 4;  // S, dP partials of the warps
  static constexpr size_t ps = MT == 1 ? 0 : size_t(2) * R * (kSdKT + kPad) * 2;  // P, dS (bf16) for dK + dV
  static constexpr size_t stats = size_t(2) * R * 4;                 // lse * log2(e), D per head
  static constexpr size_t total = k + qd + part + ps + stats;
};

// Backward, one query x R = 16 MT heads per block, 4 warps per m-tile each owning c / 4 dims. Per 32-key tile:
// partial S, dP (A = Q, dO by ldmatrix, B = the key tile's own dims) summed over the m-tile's 4 warps through shared
// memory; P = exp(S - lse), dS = P (dP - D) / sqrt(c) in registers; dQ += dS K over the warp's dims (dS's C
// fragments are A fragments); dK + dV of the tile's rows = dS^T Q + P^T dO summed over the block's heads, stored
// to the block's partial rows (DET) or added with 16-byte fp32 atomics, per 32-dim chunk. MT = 1: warp d takes dims d c / 4 with A = dS^T, P^T transposed in
// registers (movmatrix) and no third barrier; MT > 1: P, dS go to shared memory (bf16) and warp (mt, d) takes dims
// d c / 4 + mt c / (4 MT) over all R heads (A by ldmatrix.trans), B = Q, dO (ldmatrix.trans).
template <int C, int MT, bool DET = false>
__global__ void __launch_bounds__(128 * MT, MT == 1 ? 2 : 1)
    sd_bwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t H, SparseKeySets keys,
                  const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv, float* dcmp,
                  float* dsink_part, float scale, dkv_reduce::PartOut po) {
  constexpr int T = 128 * MT, R = 16 * MT, W = 4 * MT, DQ = C / 4, NKS = DQ / 16, ND = DQ / 8, kChunk = 32;
  constexpr int DK = DQ / MT;  // dK + dV dims per warp
  static_assert(DK % kChunk == 0, "dK + dV chunks");
  using L = SdBwdSmem<C, MT>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* qs = reinterpret_cast<bf16*>(smem + L::k);
  bf16* dos = qs + R * C;
  float* part = reinterpret_cast<float*>(smem + L::k + L::qd);  // [2: S, dP][W warps][16][32]
  bf16* pss = reinterpret_cast<bf16*>(smem + L::k + L::qd + L::part);  // MT > 1: [R][32 + kPad] P, then dS
  bf16* dss = pss + R * (kSdKT + kPad);
  float* stats = reinterpret_cast<float*>(smem + L::k + L::qd + L::part + L::ps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = warp / 4, dqw = warp % 4, dim0 = dqw * DQ;
  const int64_t i = po.u0 + blockIdx.x, h0 = int64_t(blockIdx.y) * R, row0 = i * H + h0;
  const int n_heads = int(min(int64_t(R), H - h0));
  const KeyList l = key_list(keys, i);
  const int n_tiles = int((l.size() + kSdKT - 1) / kSdKT);

  int src_c = key_src32(l, lane), src_n = key_src32(l, kSdKT + lane);
  sd_issue<C, T>(src_c, ks, kv, cmp);
  sd_load_rows<C, T, R>(q, row0, n_heads, qs);
  sd_load_rows<C, T, R>(do_, row0, n_heads, dos);
  cp_async_commit();
  {  // D = dO . O per head (8 threads per row), lse, and the sink's gradient share.
    const int r = threadIdx.x / 8, p8 = threadIdx.x % 8;
    float D = 0.f;
    if (r < n_heads) {
      const uint4* ov = reinterpret_cast<const uint4*>(o + (row0 + r) * C) + p8 * (C / 64);
      const uint4* dv = reinterpret_cast<const uint4*>(do_ + (row0 + r) * C) + p8 * (C / 64);
#pragma unroll
      for (int v = 0; v < C / 64; ++v) {
        const uint4 a = ov[v], b = dv[v];
        const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
        const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 x = __bfloat1622float2(a2[e]), y = __bfloat1622float2(b2[e]);
          D = fmaf(x.x, y.x, fmaf(x.y, y.y, D));
        }
      }
    }
#pragma unroll
    for (int x = 1; x < 8; x <<= 1) D += __shfl_xor_sync(0xffffffffu, D, x);
    if (p8 == 0) {
      if (r < n_heads) {
        const float L_r = lse[row0 + r];
        stats[r] = L_r * kLog2e;
        stats[R + r] = D;
        dsink_part[row0 + r] = -__expf(sink[h0 + r] - L_r) * D;
      } else {
        stats[r] = INFINITY;  // padding rows: P = 0
        stats[R + r] = 0.f;
      }
    }
  }
  __syncthreads();
  const int r_lo = mt * 16 + g, r_hi = r_lo + 8;
  const float L0 = stats[r_lo], L1 = stats[r_hi], D0 = stats[R + r_lo], D1 = stats[R + r_hi];
  const float sl2 = scale * kLog2e;
  float dqa[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dqa[n][e] = 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int src_nn = key_src32(l, int64_t(tile + 2) * kSdKT + lane);
    cp_async_wait<0>();
    __syncthreads();
    const bf16* kb = ks + (tile & 1) * kSdKT * C;
    if (tile + 1 < n_tiles) sd_issue<C, T>(src_n, ks + ((tile + 1) & 1) * kSdKT * C, kv, cmp);
    cp_async_commit();
    const unsigned valid = __ballot_sync(0xffffffffu, src_c != -1);

    float s[4][4], dp[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < NKS; ++kk) {
      const int c0 = (dim0 + kk * 16) / 8;
      uint32_t a[4], d[4];
      ldsm_x4(a, qs + swz<C>(mt * 16 + lane % 16, c0 + lane / 16));
      ldsm_x4(d, dos + swz<C>(mt * 16 + lane % 16, c0 + lane / 16));
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, kb + swz<C>(np * 16 + (lane % 8) + (lane / 16) * 8, c0 + (lane / 8) % 2));
        mma(s[2 * np], a, b[0], b[1]);
        mma(s[2 * np + 1], a, b[2], b[3]);
        mma(dp[2 * np], d, b[0], b[1]);
        mma(dp[2 * np + 1], d, b[2], b[3]);
      }
    }
    float* ps = part + warp * 16 * kSdKT;
    float* pd = part + (W + warp) * 16 * kSdKT;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      *reinterpret_cast<float2*>(ps + part_off(g, n, t)) = make_float2(s[n][0], s[n][1]);
      *reinterpret_cast<float2*>(ps + part_off(g + 8, n, t)) = make_float2(s[n][2], s[n][3]);
      *reinterpret_cast<float2*>(pd + part_off(g, n, t)) = make_float2(dp[n][0], dp[n][1]);
      *reinterpret_cast<float2*>(pd + part_off(g + 8, n, t)) = make_float2(dp[n][2], dp[n][3]);
    }
    __syncthreads();
    // P and dS (fp32, rows g / g + 8, keys 8 n + 2 t + {0, 1}); packed bf16 as A fragments of the 16-key steps.
    uint32_t pb[4][2], db[4][2];  // [n-tile][row half]
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      float sv[4] = {0.f, 0.f, 0.f, 0.f}, dv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const float* xs = part + (mt * 4 + d) * 16 * kSdKT;
        const float* xd = part + (W + mt * 4 + d) * 16 * kSdKT;
        const float2 a = *reinterpret_cast<const float2*>(xs + part_off(g, n, t));
        const float2 b = *reinterpret_cast<const float2*>(xs + part_off(g + 8, n, t));
        const float2 c = *reinterpret_cast<const float2*>(xd + part_off(g, n, t));
        const float2 e = *reinterpret_cast<const float2*>(xd + part_off(g + 8, n, t));
        sv[0] += a.x, sv[1] += a.y, sv[2] += b.x, sv[3] += b.y;
        dv[0] += c.x, dv[1] += c.y, dv[2] += e.x, dv[3] += e.y;
      }
      float p[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool ok = (valid >> (8 * n + 2 * t + (e & 1))) & 1u;
        const float Lr = e < 2 ? L0 : L1, Dr = e < 2 ? D0 : D1;
        p[e] = ok ? ex2(sv[e] * sl2 - Lr) : 0.f;
        ds[e] = p[e] * (dv[e] - Dr) * scale;
      }
      pb[n][0] = pack_bf16(p[0], p[1]), pb[n][1] = pack_bf16(p[2], p[3]);
      db[n][0] = pack_bf16(ds[0], ds[1]), db[n][1] = pack_bf16(ds[2], ds[3]);
    }
    // dQ += dS K over the warp's dims.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint32_t a[4] = {db[2 * kk][0], db[2 * kk][1], db[2 * kk + 1][0], db[2 * kk + 1][1]};
      const int vr = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int n = 0; n < ND; n += 2) {
        uint32_t b[4];
        ldsm_x4_t(b, kb + swz<C>(vr, (dim0 + n * 8) / 8 + lane / 16));
        mma(dqa[n], a, b[0], b[1]);
        mma(dqa[n + 1], a, b[2], b[3]);
      }
    }
    // Destination rows of keys 16 mk + g, 16 mk + g + 8 (null: no key).
    float* rows[2][2];
    const int dk0 = MT == 1 ? dim0 : dim0 + mt * DK;
#pragma unroll
    for (int mk = 0; mk < 2; ++mk)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int src = __shfl_sync(0xffffffffu, src_c, 16 * mk + 8 * hf + g);
        if constexpr (DET)
          rows[mk][hf] = src == -1 ? nullptr
                                   : po.part + ((blockIdx.x * uint32_t(po.n_slots) +
                                                 uint32_t(tile * kSdKT + 16 * mk + 8 * hf + g)) * gridDim.y +
                                                blockIdx.y) * uint32_t(C) + dk0;
        else
          rows[mk][hf] =
              src == -1 ? nullptr : (src >= 0 ? dkv + int64_t(src) * C : dcmp + int64_t(-src - 2) * C) + dk0;
      }
    const int br = (lane % 8) + ((lane / 8) % 2) * 8;
    if constexpr (MT == 1) {
      // dK + dV over the warp's dims: A = dS^T, P^T (keys x heads) by 8 x 8 transposes: m-tile mk (keys 16 mk ..)
      // = {T(heads 0-7, keys 16mk..), T(0-7, 16mk+8..), T(8-15, 16mk..), T(8-15, 16mk+8..)}.
      uint32_t adt[2][4], apt[2][4];
#pragma unroll
      for (int mk = 0; mk < 2; ++mk) {
        adt[mk][0] = movm_t(db[2 * mk][0]), adt[mk][1] = movm_t(db[2 * mk + 1][0]);
        adt[mk][2] = movm_t(db[2 * mk][1]), adt[mk][3] = movm_t(db[2 * mk + 1][1]);
        apt[mk][0] = movm_t(pb[2 * mk][0]), apt[mk][1] = movm_t(pb[2 * mk + 1][0]);
        apt[mk][2] = movm_t(pb[2 * mk][1]), apt[mk][3] = movm_t(pb[2 * mk + 1][1]);
      }
#pragma unroll 1
      for (int ch = 0; ch < DK / kChunk; ++ch) {
        float acc[2][kChunk / 8][4];
#pragma unroll
        for (int mk = 0; mk < 2; ++mk)
#pragma unroll
          for (int n = 0; n < kChunk / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mk][n][e] = 0.f;
#pragma unroll
        for (int n = 0; n < kChunk / 8; n += 2) {
          const int cc = (dk0 + ch * kChunk + n * 8) / 8 + lane / 16;
          uint32_t bq[4], bd[4];
          ldsm_x4_t(bq, qs + swz<C>(br, cc));
          ldsm_x4_t(bd, dos + swz<C>(br, cc));
#pragma unroll
          for (int mk = 0; mk < 2; ++mk) {
            mma(acc[mk][n], adt[mk], bq[0], bq[1]);
            mma(acc[mk][n + 1], adt[mk], bq[2], bq[3]);
            mma(acc[mk][n], apt[mk], bd[0], bd[1]);
            mma(acc[mk][n + 1], apt[mk], bd[2], bd[3]);
          }
        }
#pragma unroll
        for (int mk = 0; mk < 2; ++mk)
#pragma unroll
          for (int n = 0; n < kChunk / 8; ++n) {
            const int off = ch * kChunk + n * 8;
            frag_out<DET>(acc[mk][n], rows[mk][0] ? rows[mk][0] + off : nullptr,
                          rows[mk][1] ? rows[mk][1] + off : nullptr, t);
          }
      }
    } else {
      // P, dS of the m-tile to shared memory (warp d = 0 of each m-tile), then dK + dV over all R heads.
      if (dqw == 0) {
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int col = 8 * n + 2 * t;
          *reinterpret_cast<uint32_t*>(pss + r_lo * (kSdKT + kPad) + col) = pb[n][0];
          *reinterpret_cast<uint32_t*>(pss + r_hi * (kSdKT + kPad) + col) = pb[n][1];
          *reinterpret_cast<uint32_t*>(dss + r_lo * (kSdKT + kPad) + col) = db[n][0];
          *reinterpret_cast<uint32_t*>(dss + r_hi * (kSdKT + kPad) + col) = db[n][1];
        }
      }
      __syncthreads();
#pragma unroll 1
      for (int ch = 0; ch < DK / kChunk; ++ch) {
        float acc[2][kChunk / 8][4];
#pragma unroll
        for (int mk = 0; mk < 2; ++mk)
#pragma unroll
          for (int n = 0; n < kChunk / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mk][n][e] = 0.f;
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          const bf16* as = pass == 0 ? dss : pss;
          const bf16* bs = pass == 0 ? qs : dos;
#pragma unroll
          for (int kh = 0; kh < R; kh += 16) {
            uint32_t a[2][4];
#pragma unroll
            for (int mk = 0; mk < 2; ++mk)
              ldsm_x4_t(a[mk], as + (kh + (lane % 8) + (lane / 16) * 8) * (kSdKT + kPad) + mk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
            for (int n = 0; n < kChunk / 8; n += 2) {
              uint32_t b[4];
              ldsm_x4_t(b, bs + swz<C>(kh + br, (dk0 + ch * kChunk + n * 8) / 8 + lane / 16));
#pragma unroll
              for (int mk = 0; mk < 2; ++mk) {
                mma(acc[mk][n], a[mk], b[0], b[1]);
                mma(acc[mk][n + 1], a[mk], b[2], b[3]);
              }
            }
          }
        }
#pragma unroll
        for (int mk = 0; mk < 2; ++mk)
#pragma unroll
          for (int n = 0; n < kChunk / 8; ++n) {
            const int off = ch * kChunk + n * 8;
            frag_out<DET>(acc[mk][n], rows[mk][0] ? rows[mk][0] + off : nullptr,
                          rows[mk][1] ? rows[mk][1] + off : nullptr, t);
          }
      }
    }
    src_c = src_n, src_n = src_nn;
  }
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    const int col = dim0 + n * 8 + 2 * t;
    if (r_lo < n_heads)
      *reinterpret_cast<__nv_bfloat162*>(dq + (row0 + r_lo) * C + col) = __floats2bfloat162_rn(dqa[n][0], dqa[n][1]);
    if (r_hi < n_heads)
      *reinterpret_cast<__nv_bfloat162*>(dq + (row0 + r_hi) * C + col) =
          __floats2bfloat162_rn(dqa[n][2], dqa[n][3]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Hopper wgmma forward (wg_fwd_kernel, sm_90a): one query x 64 heads per block (M = 64 = one wgmma tile), two
// warpgroups that each own c / 2 output dims. Per 64-key tile both warpgroups compute the whole S = Q K^T
// (m64n64k16, Q and the key tile from shared memory) -- the redundant half of the S products costs less than a
// P exchange -- then the online softmax in registers and O += P V with P straight from the S accumulators (A from
// registers) and V = the same key tile read MN-major (m64n256k16 / m64n128k16). Q and the key tiles live in
// shared memory in the 128-byte-swizzle layout wgmma reads (8 KiB chunks of 64 rows x 64 dims, 16-byte chunk c
// of row r at c ^ (r & 7)); the descriptors follow grouped_gemm_sm90.cuh's measured conventions. Key sources are
// prefetched two tiles ahead (lane r holds keys r and r + 32), cp.async copies double-buffer the key tiles.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TREX_ATTN_SM90A 1
#endif
constexpr int kWgKT = 64;       // keys per tile
constexpr int kWgChunk = 8192;  // one 64-row x 64-dim bf16 chunk (128-byte rows)

__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lead & 0x3FFFF) >> 4) << 16) |
         (uint64_t((stride & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 64] (fp32, 32 registers per thread) (+)= A[64 x 16] B[64 x 16]^T, both K-major shared-memory tiles.
__device__ __forceinline__ void wg_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}
// D[64 x 256] (fp32, 128 registers per thread) += A[64 x 16] (registers, the mma.sync A fragment layout per
// warp) B[16 x 256] (shared memory, MN-major: the key tile read transposed).
__device__ __forceinline__ void wg_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, "
      "%71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
      "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, "
      "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "
      "%125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
        "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
        "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// D[64 x 128] (fp32, 64 registers per thread) += A[64 x 16] (registers, the mma.sync A fragment layout per
// warp) B[16 x 128] (shared memory, MN-major: the key tile read transposed).
__device__ __forceinline__ void wg_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, "
      "1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// Byte offset of (row, 16-byte chunk c16) in a [64 rows][C] tile stored as C / 64 swizzled 8 KiB chunks.
__device__ __forceinline__ uint32_t wg_off(int row, int c16) {
  return uint32_t((c16 >> 3) * kWgChunk + row * 128 + (((c16 & 7) ^ (row & 7)) << 4));
}

template <int C, bool SPLIT_S>
struct WgFwdSmem {
  static constexpr size_t q = size_t(64) * C * 2;
  static constexpr size_t k = size_t(64) * C * 2;  // per stage
  static constexpr size_t part = SPLIT_S ? size_t(2) * 64 * 64 * 4 : 0;  // S partials of the two warpgroups
  static constexpr size_t total = q + 2 * k + part + 1024;  // + alignment slack (1024-byte aligned chunks)
};
// Float offset of S columns 8 j + 2 t of row r in a [64][64] fp32 partial: the float2 index XORed with 4 r mod 16
// so a half warp's 16 (row, t) pairs hit distinct banks.
__device__ __forceinline__ int wg_part_off(int r, int j, int t) {
  return r * 64 + 2 * ((4 * j + t) ^ ((4 * r) & 15));
}

// cp.async of a 64-key tile (lane r holds the sources of keys r and r + 32) into the swizzled chunks at kb.
template <int C>
__device__ __forceinline__ void wg_issue(int src0, int src1, uint32_t kb, const bf16* kv, const bf16* cmp) {
  constexpr int kChunks = C / 8, kRows = 256 / kChunks;
#pragma unroll
  for (int it = 0; it < kWgKT / kRows; ++it) {
    const int r = it * kRows + int(threadIdx.x) / kChunks, ch = int(threadIdx.x) % kChunks;
    const int a = __shfl_sync(0xffffffffu, src0, r % 32), b = __shfl_sync(0xffffffffu, src1, r % 32);
    const int src = r < 32 ? a : b;
    const bf16* g = src >= 0 ? kv + int64_t(src) * C : cmp + int64_t(-src - 2) * C;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(kb + wg_off(r, ch)),
                 "l"(src == -1 ? kv : g + ch * 8), "r"(src != -1 ? 16 : 0));
  }
}

// SPLIT_S: warpgroup w computes the partial S over dims [w c / 2, (w + 1) c / 2) only and the two partials are
// summed through shared memory (fp32 addition commutes, so both warpgroups get the same S): no redundant S.
template <int C, bool SPLIT_S>
__global__ void __launch_bounds__(256, 1)
    wg_fwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t H, SparseKeySets keys,
                  bf16* o, float* lse, float scale) {
#ifdef TREX_ATTN_SM90A
  constexpr int DW = C / 2, NO = DW / 2;  // dims per warpgroup; accumulator registers per thread
  using L = WgFwdSmem<C, SPLIT_S>;
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
  float* part = reinterpret_cast<float*>(smem + (base - smem_u32(smem)) + L::q + 2 * L::k);  // SPLIT_S: [2][64][64]
  const uint32_t qs = base, ks = base + uint32_t(L::q);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wg = warp / 4, wr = (warp % 4) * 16;  // warpgroup; the warp's first row of the 64
  const int64_t i = blockIdx.x, h0 = int64_t(blockIdx.y) * 64, row0 = i * H + h0;
  const int n_heads = int(min(int64_t(64), H - h0));
  const KeyList l = key_list(keys, i);
  const int n_tiles = int((l.size() + kWgKT - 1) / kWgKT);

  int c0 = key_src32(l, lane), c1 = key_src32(l, 32 + lane);
  int n0 = key_src32(l, kWgKT + lane), n1 = key_src32(l, kWgKT + 32 + lane);
  wg_issue<C>(c0, c1, ks, kv, cmp);
  for (int idx = threadIdx.x; idx < 64 * (C / 8); idx += 256) {
    const int r = idx / (C / 8), ch = idx % (C / 8);
    const bool ok = r < n_heads;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(qs + wg_off(r, ch)),
                 "l"(ok ? q + (row0 + r) * C + ch * 8 : q), "r"(ok ? 16 : 0));
  }
  cp_async_commit();

  const int r_lo = wr + g, r_hi = r_lo + 8;
  const float sl2 = scale * kLog2e;
  float m0 = r_lo < n_heads ? sink[h0 + r_lo] * kLog2e : 0.f, m1 = r_hi < n_heads ? sink[h0 + r_hi] * kLog2e : 0.f;
  float l0 = t == 0 ? 1.f : 0.f, l1 = l0;
  float acc[NO];
#pragma unroll
  for (int e = 0; e < NO; ++e) acc[e] = 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int nn0 = key_src32(l, int64_t(tile + 2) * kWgKT + lane), nn1 = key_src32(l, int64_t(tile + 2) * kWgKT + 32 + lane);
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes -> wgmma reads
    __syncthreads();
    const uint32_t kb = ks + uint32_t((tile & 1) * L::k);
    if (tile + 1 < n_tiles) wg_issue<C>(n0, n1, ks + uint32_t(((tile + 1) & 1) * L::k), kv, cmp);
    cp_async_commit();
    const unsigned v0 = __ballot_sync(0xffffffffu, c0 != -1), v1 = __ballot_sync(0xffffffffu, c1 != -1);

    float s[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) s[e] = 0.f;
    wg_fence();
    constexpr int kK0 = 0, kK1 = SPLIT_S ? C / 32 : C / 16;  // k16 steps of this warpgroup (+ wg * kK1 if split)
#pragma unroll
    for (int kk = kK0; kk < kK1; ++kk) {
      const int kg = SPLIT_S ? kk + wg * kK1 : kk;
      const uint32_t off = uint32_t((kg / 4) * kWgChunk + (kg % 4) * 32);
      wg_m64n64k16_ss(s, wg_desc(qs + off, 16, 1024), wg_desc(kb + off, 16, 1024), kk > 0);
    }
    wg_commit();
    wg_wait0();
    wg_fence_acc(s);
    if constexpr (SPLIT_S) {
      float* mine = part + wg * 64 * 64;
      const float* other = part + (wg ^ 1) * 64 * 64;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<float2*>(mine + wg_part_off(r_lo, j, t)) = make_float2(s[4 * j], s[4 * j + 1]);
        *reinterpret_cast<float2*>(mine + wg_part_off(r_hi, j, t)) = make_float2(s[4 * j + 2], s[4 * j + 3]);
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 x = *reinterpret_cast<const float2*>(other + wg_part_off(r_lo, j, t));
        const float2 y = *reinterpret_cast<const float2*>(other + wg_part_off(r_hi, j, t));
        s[4 * j] += x.x, s[4 * j + 1] += x.y, s[4 * j + 2] += y.x, s[4 * j + 3] += y.y;
      }
    }
    // Online softmax (rows r_lo / r_hi, keys 8 j + 2 t + {0, 1} in s[4 j ..]).
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e & 1);
        const bool ok = ((col < 32 ? v0 >> col : v1 >> (col - 32)) & 1u) != 0;
        float& z = s[4 * j + e];
        z = ok ? z * sl2 : -INFINITY;
        if (e < 2) mx0 = fmaxf(mx0, z);
        else mx1 = fmaxf(mx1, z);
      }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float a0 = ex2(m0 - mn0), a1 = ex2(m1 - mn1);
    m0 = mn0, m1 = mn1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[4 * j] = ex2(s[4 * j] - mn0), s[4 * j + 1] = ex2(s[4 * j + 1] - mn0);
      s[4 * j + 2] = ex2(s[4 * j + 2] - mn1), s[4 * j + 3] = ex2(s[4 * j + 3] - mn1);
      sum0 += s[4 * j] + s[4 * j + 1], sum1 += s[4 * j + 2] + s[4 * j + 3];
    }
    l0 = l0 * a0 + sum0, l1 = l1 * a1 + sum1;
#pragma unroll
    for (int j = 0; j < NO / 4; ++j) acc[4 * j] *= a0, acc[4 * j + 1] *= a0, acc[4 * j + 2] *= a1, acc[4 * j + 3] *= a1;
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]), pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]), pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t db = wg_desc(kb + uint32_t(wg * (DW / 64) * kWgChunk + kk * 2048), kWgChunk, 1024);
      if constexpr (C == 512) wg_m64n256k16_rs(acc, pa[kk], db);
      else wg_m64n128k16_rs(acc, pa[kk], db);
    }
    wg_commit();
    wg_wait0();
    wg_fence_acc(acc);
    c0 = n0, c1 = n1, n0 = nn0, n1 = nn1;
  }
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
#pragma unroll
  for (int j = 0; j < NO / 4; ++j) {
    const int col = wg * DW + 8 * j + 2 * t;
    if (r_lo < n_heads)
      *reinterpret_cast<__nv_bfloat162*>(o + (row0 + r_lo) * C + col) =
          __floats2bfloat162_rn(acc[4 * j] * inv0, acc[4 * j + 1] * inv0);
    if (r_hi < n_heads)
      *reinterpret_cast<__nv_bfloat162*>(o + (row0 + r_hi) * C + col) =
          __floats2bfloat162_rn(acc[4 * j + 2] * inv1, acc[4 * j + 3] * inv1);
  }
  if (wg == 0 && t == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    if (r_lo < n_heads) lse[row0 + r_lo] = m0 * kLn2 + logf(l0);
    if (r_hi < n_heads) lse[row0 + r_hi] = m1 * kLn2 + logf(l1);
  }
#endif
}

// Heads per block: 64 (4 m-tiles), or 16 / 32 when H is that small (2 * MT warps must split c evenly).
inline int m_tiles(int64_t H) {
  return H <= 16 ? 1 : H <= 32 ? 2 : 4;
}


// DET: the units [po.u0, po.u0 + n_units) with their dK + dV rows stored to po.part; else every unit (n_units < 0)
// with atomics into dkv / dcmp. part = the sink partials [N, H].
template <int C, int MT, bool MQ = false, bool PF = false, bool DET = false>
void launch_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                float* dcmp, float* part, cudaStream_t s, dkv_reduce::PartOut po = {}, int64_t n_units = -1) {
  const size_t smem = BwdSmem<C, MT>::total;
  TREX_CUDA(cudaFuncSetAttribute(bwd_kernel<C, MT, MQ, PF, DET>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem)));
  const int qb = MQ ? int(16 * MT / H) : 1;
  if (n_units < 0) n_units = MQ ? (N + qb - 1) / qb : N;
  dim3 grid(unsigned(n_units), unsigned(MQ ? 1 : (H + 16 * MT - 1) / (16 * MT)));
  bwd_kernel<C, MT, MQ, PF, DET><<<grid, 64 * MT, smem, s>>>(q, kv, cmp, sink, N, H, qb, keys, o, lse, do_, dq, dkv,
                                                           dcmp, part, 1.f / sqrtf(float(C)), po);
  TREX_CUDA_LAUNCHED();
}

template <int C, int MT>
void launch_sd_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                   const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  const size_t smem = SdFwdSmem<C, MT>::total;
  TREX_CUDA(cudaFuncSetAttribute(sd_fwd_kernel<C, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  TREX_CUDA(cudaFuncSetAttribute(sd_fwd_kernel<C, MT>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared)));
  dim3 grid(unsigned(N), unsigned((H + 16 * MT - 1) / (16 * MT)));
  sd_fwd_kernel<C, MT><<<grid, 128 * MT, smem, s>>>(q, kv, cmp, sink, H, keys, o, lse, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}

// DET / n_units: as launch_bwd (a unit = one query).
template <int C, int MT, bool DET = false>
void launch_sd_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                   const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                   float* dcmp, float* part, cudaStream_t s, dkv_reduce::PartOut po = {}, int64_t n_units = -1) {
  const size_t smem = SdBwdSmem<C, MT>::total;
  TREX_CUDA(cudaFuncSetAttribute(sd_bwd_kernel<C, MT, DET>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  TREX_CUDA(cudaFuncSetAttribute(sd_bwd_kernel<C, MT, DET>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared)));
  dim3 grid(unsigned(n_units < 0 ? N : n_units), unsigned((H + 16 * MT - 1) / (16 * MT)));
  sd_bwd_kernel<C, MT, DET><<<grid, 128 * MT, smem, s>>>(q, kv, cmp, sink, H, keys, o, lse, do_, dq, dkv, dcmp,
                                                         part, 1.f / sqrtf(float(C)), po);
  TREX_CUDA_LAUNCHED();
}

template <int C, bool SPLIT_S>
void launch_wg_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                   const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  const size_t smem = WgFwdSmem<C, SPLIT_S>::total;
  TREX_CUDA(cudaFuncSetAttribute(wg_fwd_kernel<C, SPLIT_S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid(unsigned(N), unsigned((H + 63) / 64));
  wg_fwd_kernel<C, SPLIT_S><<<grid, 256, smem, s>>>(q, kv, cmp, sink, H, keys, o, lse, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}


}  // namespace trex::cuda::mma_attn
