// Tensor-core sparse MQA (see attention_sparse_mma.h). Layout of the work, per block = one query i and
// R = 16 * MT heads (MT m-tiles of 16 heads, 2 * MT warps):
//   S phase   warp w computes S[16 heads of m-tile w/2][16 keys of half w%2] over the c dims (Q and the key
//             tile both from smem through ldmatrix);
//   softmax   4 threads per head row: online max / sum over the 32-key tile, P (bf16) and the rescale factor
//             alpha to smem (forward); the backward needs no cross-warp step since lse is known;
//   PV phase  warp w owns c / (2 MT) output dims for all R heads: O = alpha O + P V (V = the same key tile,
//             read transposed with ldmatrix.trans).
// Fragment layouts are those of PTX mma.m16n8k16 (row.col): g = lane / 4 is the row (and B's column), t = lane % 4.
#include "kernels/cuda/attention_sparse_mma.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_ptx.cuh"

namespace trex::cuda::mma_attn {
namespace {

using namespace ptx;

constexpr int kKT = 32;  // keys per tile (backward; the forward takes it as a template parameter, 32 or 64)
constexpr int kPad = 8;  // bf16 per smem row: a 16-byte shift so the 8 rows of an ldmatrix hit distinct banks

// The keys of query i: window rows [win_begin, i], then n_cmp compressed slots (same order as the CPU path).
struct KeyList {
  int64_t win_begin, n_win, n_cmp, cmp_begin;
  const int64_t* sel;
  __device__ int64_t size() const { return n_win + n_cmp; }
};

__device__ inline KeyList key_list(const SparseKeySets& k, int64_t i) {
  KeyList l;
  l.win_begin = k.win_begin[i];
  l.n_win = i - l.win_begin + 1;
  l.sel = nullptr;
  l.cmp_begin = 0;
  l.n_cmp = 0;
  if (k.cmp_sel) {
    l.sel = k.cmp_sel + i * k.k_sel;
    l.n_cmp = k.k_sel;
  } else if (k.cmp_begin) {
    l.cmp_begin = k.cmp_begin[i];
    l.n_cmp = k.cmp_end[i] - l.cmp_begin;
  }
  return l;
}

// The union of the key lists of queries i0 .. i0 + nq - 1 (the multi-query forward): window rows
// [win_begin[i0], i0 + nq - 1], then the compressed slots of all nq queries (CSA: their selections back to back,
// [N, k_sel] is contiguous; HCA: the smallest range covering theirs). Each query masks the keys not its own.
__device__ inline KeyList union_key_list(const SparseKeySets& k, int64_t i0, int nq) {
  KeyList l = key_list(k, i0);
  const int64_t i1 = i0 + nq - 1;
  for (int64_t i = i0 + 1; i <= i1; ++i) l.win_begin = min(l.win_begin, k.win_begin[i]);
  l.n_win = i1 - l.win_begin + 1;
  if (k.cmp_sel) {
    l.n_cmp = nq * k.k_sel;
  } else if (k.cmp_begin) {
    int64_t b = k.cmp_begin[i0], e = k.cmp_end[i0];
    for (int64_t i = i0 + 1; i <= i1; ++i) b = min(b, k.cmp_begin[i]), e = max(e, k.cmp_end[i]);
    l.cmp_begin = b;
    l.n_cmp = max(e - b, int64_t(0));
  }
  return l;
}

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

// acc[np][n] += A(16 rows of as) . B^T where B = 16 NP keys of ks: n8 tile n of key pair np = keys 16 np + 8 n ..,
// summed over C dims (both operands row-major [row][C + kPad] in smem).
template <int C, int NP>
__device__ __forceinline__ void qk_tile(float (&acc)[NP][2][4], const bf16* as, const bf16* ks, int lane) {
  const bf16* ap = as + (lane % 16) * (C + kPad) + (lane / 16) * 8;
  const bf16* bp = ks + ((lane % 8) + (lane / 16) * 8) * (C + kPad) + ((lane / 8) % 2) * 8;
#pragma unroll 8
  for (int kd = 0; kd < C; kd += 16) {
    uint32_t a[4];
    ldsm_x4(a, ap + kd);
#pragma unroll
    for (int np = 0; np < NP; ++np) {
      uint32_t b[4];
      ldsm_x4(b, bp + np * 16 * (C + kPad) + kd);
      mma(acc[np][0], a, b[0], b[1]);
      mma(acc[np][1], a, b[2], b[3]);
    }
  }
}

template <int C, int MT, int KT>
struct FwdSmem {
  static constexpr int R = 16 * MT;
  static constexpr size_t q = size_t(R) * (C + kPad) * 2;
  static constexpr size_t k = size_t(2) * KT * (C + kPad) * 2;
  static constexpr size_t s = size_t(R) * (KT + 4) * 4;
  static constexpr size_t p = size_t(R) * (KT + kPad) * 2;
  static constexpr size_t srcs = size_t(2) * KT * 8;
  static constexpr size_t stats = size_t(3) * R * 4;
  static constexpr size_t total = q + k + s + p + srcs + stats;
};

// W warps (2 MT or 4 MT): in the S phase warp w takes m-tile w / (W / MT) and KT / (W / MT) keys; the softmax
// gives each head row 2 W / MT threads; in the PV phase warp w owns c / W output dims.
// MQ (multi-query, for H <= 32): a block serves qb = R / H consecutive queries (rows = their (query, head) pairs,
// contiguous in [N, H, c]) over the union of their key lists, each row masking the keys not its query's; the
// shared window rows are then loaded once for qb queries and the M dimension is filled.
template <int C, int MT, int KT, int W, bool MQ>
__global__ void __launch_bounds__(32 * W)
    fwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int qb,
               SparseKeySets keys, bf16* o, float* lse, float scale) {
  constexpr int T = 32 * W, R = 16 * MT, DW = C / W;
  using L = FwdSmem<C, MT, KT>;
  constexpr int KG = W / MT, WK = KT / KG;  // key groups; keys per warp in the S phase
  constexpr int NP = WK / 16, TPR = T / R, KPT = KT / TPR;  // key pairs per warp; threads, keys per softmax row
  static_assert(W % MT == 0 && WK % 16 == 0 && KPT % 8 == 0 && (TPR & (TPR - 1)) == 0, "fwd tiling");
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem + L::q);
  float* ss = reinterpret_cast<float*>(smem + L::q + L::k);
  bf16* ps = reinterpret_cast<bf16*>(smem + L::q + L::k + L::s);
  int64_t* srcs = reinterpret_cast<int64_t*>(smem + L::q + L::k + L::s + L::p);
  float* m_s = reinterpret_cast<float*>(smem + L::q + L::k + L::s + L::p + L::srcs);
  float* l_s = m_s + R;
  float* a_s = l_s + R;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Rows of the block: (query, head) pairs base_row + r of the [N * H] row space.
  const int64_t i = MQ ? int64_t(blockIdx.x) * qb : blockIdx.x;
  const int64_t h0 = MQ ? 0 : int64_t(blockIdx.y) * R;
  const int nq = MQ ? int(min(int64_t(qb), N - i)) : 1;
  const int n_heads = MQ ? int(nq * H) : int(min(int64_t(R), H - h0));  // rows in use
  const int64_t base_row = i * H + h0;
  const KeyList l = MQ ? union_key_list(keys, i, nq) : key_list(keys, i);
  const int n_tiles = int((l.size() + KT - 1) / KT);

  load_heads<C, T, R>(q, base_row, 1, 0, n_heads, qs);
  load_tile<C, T, KT>(l, 0, kv, cmp, ks, srcs);
  cp_async_commit();
  if (threadIdx.x < R) {
    m_s[threadIdx.x] = threadIdx.x < n_heads ? sink[(h0 + threadIdx.x) % H] : 0.f;  // the sink opens the softmax
    l_s[threadIdx.x] = 1.f;
  }

  float acc[MT][DW / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < DW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;
  // Multi-query: the softmax row of this thread belongs to query i + qi, whose own key sets mask the union.
  const int qi = MQ ? min(int(threadIdx.x / TPR) / int(H), nq - 1) : 0;
  QuerySets own{};
  if (MQ) {
    own.win_begin = keys.win_begin[i + qi];
    if (keys.cmp_begin) own.cmp_begin = keys.cmp_begin[i + qi], own.cmp_end = keys.cmp_end[i + qi];
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    bf16* kb = ks + buf * KT * (C + kPad);
    if (tile + 1 < n_tiles)
      load_tile<C, T, KT>(l, int64_t(tile + 1) * KT, kv, cmp, ks + (buf ^ 1) * KT * (C + kPad), srcs + (buf ^ 1) * KT);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    // Multi-query CSA: a tile of compressed slots belongs to queries q_lo..q_hi only; the m-tiles without their
    // rows would get P = 0 (masked), so their products are skipped (warp-uniform; exact).
    int row_lo = 0, row_hi = R;
    if (MQ && keys.cmp_sel) {
      const int64_t j0 = int64_t(tile) * KT, j1 = min(j0 + KT, l.size()) - 1;
      if (j0 >= l.n_win) {
        row_lo = int((j0 - l.n_win) / keys.k_sel * H);
        row_hi = int(((j1 - l.n_win) / keys.k_sel + 1) * H);
      }
    }

    {  // S = Q K^T for (m-tile warp / KG, keys WK * (warp % KG) ..)
      float sacc[NP][2][4] = {};
      const int mw = warp / KG, nh = warp % KG;
      if (mw * 16 < row_hi && mw * 16 + 16 > row_lo)
        qk_tile<C, NP>(sacc, qs + mw * 16 * (C + kPad), kb + nh * WK * (C + kPad), lane);
#pragma unroll
      for (int np = 0; np < NP; ++np)
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          float* r0 = ss + (mw * 16 + g) * (KT + 4) + nh * WK + np * 16 + n * 8 + 2 * t;
          *reinterpret_cast<float2*>(r0) = make_float2(sacc[np][n][0], sacc[np][n][1]);
          *reinterpret_cast<float2*>(r0 + 8 * (KT + 4)) = make_float2(sacc[np][n][2], sacc[np][n][3]);
        }
    }
    __syncthreads();
    {  // online softmax: row r = tid / TPR, keys KPT * (tid % TPR) ..
      const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
      const int64_t* src = srcs + buf * KT + part * KPT;
      const float* sr = ss + r * (KT + 4) + part * KPT;
      float z[KPT], mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < KPT; ++e) {
        bool ok = src[e] >= 0;
        if (MQ) ok = ok && owns_key(l, keys, own, i + qi, qi, int64_t(tile) * KT + part * KPT + e);
        z[e] = ok ? sr[e] * scale : -INFINITY;
        mx = fmaxf(mx, z[e]);
      }
#pragma unroll
      for (int x = 1; x < TPR; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
      const float m_old = m_s[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
#pragma unroll
      for (int e0 = 0; e0 < KPT; e0 += 8) {
        uint32_t pk[4];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          const float p0 = __expf(z[e0 + e] - m_new), p1 = __expf(z[e0 + e + 1] - m_new);
          sum += p0 + p1;
          pk[e / 2] = pack_bf16(p0, p1);
        }
        *reinterpret_cast<uint4*>(ps + r * (KT + kPad) + part * KPT + e0) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
      }
#pragma unroll
      for (int x = 1; x < TPR; x <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
      if (part == 0) {
        const float alpha = __expf(m_old - m_new);
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + sum;
        a_s[r] = alpha;
      }
    }
    __syncthreads();
    {  // O = alpha O + P V for dims [warp * DW, +DW)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float a0 = a_s[mt * 16 + g], a1 = a_s[mt * 16 + g + 8];
#pragma unroll
        for (int n = 0; n < DW / 8; ++n) {
          acc[mt][n][0] *= a0, acc[mt][n][1] *= a0;
          acc[mt][n][2] *= a1, acc[mt][n][3] *= a1;
        }
      }
      bool live[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) live[mt] = mt * 16 < row_hi && mt * 16 + 16 > row_lo;
#pragma unroll
      for (int kk = 0; kk < KT; kk += 16) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          if (live[mt]) ldsm_x4(a[mt], ps + (mt * 16 + lane % 16) * (KT + kPad) + kk + (lane / 16) * 8);
        const bf16* vp = kb + (kk + (lane % 8) + ((lane / 8) % 2) * 8) * (C + kPad) + warp * DW + (lane / 16) * 8;
#pragma unroll
        for (int n = 0; n < DW / 8; n += 2) {
          uint32_t b[4];
          ldsm_x4_t(b, vp + n * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (!live[mt]) continue;
            mma(acc[mt][n], a[mt], b[0], b[1]);
            mma(acc[mt][n + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this buffer; S / P are rewritten
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + 8 * half;
      if (r >= n_heads) continue;
      const float inv = 1.f / l_s[r];
      bf16* out = o + (base_row + r) * C + warp * DW + 2 * t;
#pragma unroll
      for (int n = 0; n < DW / 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(out + n * 8) =
            __floats2bfloat162_rn(acc[mt][n][2 * half] * inv, acc[mt][n][2 * half + 1] * inv);
    }
  }
  if (threadIdx.x < n_heads) lse[base_row + threadIdx.x] = m_s[threadIdx.x] + logf(l_s[threadIdx.x]);
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

// Adds a 16 x 8 fp32 accumulator fragment to dst rows (row0 + g, row0 + g + 8), cols col0 + 2t: lanes t, t ^ 1
// swap halves so each issues one 16-byte atomic (even t: row g, cols 2t..2t+3; odd t: row g + 8).
__device__ __forceinline__ void atomic_frag(const float (&a)[4], float* row_g, float* row_g8, int t) {
  const bool odd = t & 1;
  const float sx = odd ? a[0] : a[2], sy = odd ? a[1] : a[3];
  const float rx = __shfl_xor_sync(0xffffffffu, sx, 1), ry = __shfl_xor_sync(0xffffffffu, sy, 1);
  if (!odd) {
    if (row_g) atomicAdd(reinterpret_cast<float4*>(row_g + 2 * t), make_float4(a[0], a[1], rx, ry));
  } else {
    if (row_g8) atomicAdd(reinterpret_cast<float4*>(row_g8 + 2 * (t - 1)), make_float4(rx, ry, a[2], a[3]));
  }
}

// Backward (FlashAttention-2 recomputation with the saved lse), per key tile:
//   warp (m-tile w / 2, keys 16 (w % 2) ..): S = Q K^T and dP = dO K^T share the key fragments; P = exp(S - lse),
//   dS = P (dP - D) / sqrt(c) (D = dO . O per head), both to smem as bf16;
//   dQ += dS K (warp w owns c / (2 MT) dims, in registers for the whole query);
//   dK + dV of the tile's rows = dS^T Q + P^T dO (M = 32 keys, N = 64-dim chunks round-robin over the warps,
//   K = the block's heads), added to dkv / dcmp with 16-byte fp32 atomics.
// MQ: rows are the (query, head) pairs of qb consecutive queries over the union of their keys, as in the forward
// (masked P and dS are 0, so dQ rows and the dK + dV sums are those of the separate queries).
template <int C, int MT, bool MQ>
__global__ void __launch_bounds__(64 * MT)
    bwd_kernel(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int qb,
               SparseKeySets keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
               float* dcmp, float* dsink_part, float scale) {
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
  const int64_t i = MQ ? int64_t(blockIdx.x) * qb : blockIdx.x;
  const int64_t h0 = MQ ? 0 : int64_t(blockIdx.y) * R;
  const int nq = MQ ? int(min(int64_t(qb), N - i)) : 1;
  const int n_heads = MQ ? int(nq * H) : int(min(int64_t(R), H - h0));  // rows in use
  const int64_t base_row = i * H + h0;
  const KeyList l = MQ ? union_key_list(keys, i, nq) : key_list(keys, i);
  const int n_tiles = int((l.size() + kKT - 1) / kKT);

  load_heads<C, T, R>(q, base_row, 1, 0, n_heads, qs);
  load_heads<C, T, R>(do_, base_row, 1, 0, n_heads, dos);
  load_tile<C, T>(l, 0, kv, cmp, ks, srcs);
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
    if (tile + 1 < n_tiles)
      load_tile<C, T>(l, int64_t(tile + 1) * kKT, kv, cmp, ks + (buf ^ 1) * kKT * (C + kPad), srcs + (buf ^ 1) * kKT);
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
        float* r0 = s0 < 0 ? nullptr : ((s0 & kCmpBit) ? dcmp + (s0 & ~kCmpBit) * C : dkv + s0 * C) + ch * kChunk;
        float* r1 = s1 < 0 ? nullptr : ((s1 & kCmpBit) ? dcmp + (s1 & ~kCmpBit) * C : dkv + s1 * C) + ch * kChunk;
#pragma unroll
        for (int n = 0; n < kChunk / 8; ++n)
          atomic_frag(acc[mk][n], r0 ? r0 + n * 8 : nullptr, r1 ? r1 + n * 8 : nullptr, t);
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

// Heads per block: 64 (4 m-tiles), or 16 / 32 when H is that small (2 * MT warps must split c evenly).
int m_tiles(int64_t H) {
  return H <= 16 ? 1 : H <= 32 ? 2 : 4;
}

template <int C, int MT, int KT, int W, bool MQ = false>
void launch_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  const size_t smem = FwdSmem<C, MT, KT>::total;
  TREX_CUDA(
      cudaFuncSetAttribute(fwd_kernel<C, MT, KT, W, MQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int qb = MQ ? int(16 * MT / H) : 1;
  dim3 grid(unsigned(MQ ? (N + qb - 1) / qb : N), unsigned(MQ ? 1 : (H + 16 * MT - 1) / (16 * MT)));
  fwd_kernel<C, MT, KT, W, MQ>
      <<<grid, 32 * W, smem, s>>>(q, kv, cmp, sink, N, H, qb, keys, o, lse, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}

template <int C, int KT, int WPM>  // WPM warps per m-tile
void fwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
           const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  switch (m_tiles(H)) {
    case 1:
      return launch_fwd<C, 1, KT, WPM>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case 2:
      return launch_fwd<C, 2, KT, 2 * WPM>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    default:
      return launch_fwd<C, 4, KT, 4 * WPM>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  }
}

template <int C, int MT, bool MQ = false>
void launch_bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
                float* dcmp, float* part, cudaStream_t s) {
  const size_t smem = BwdSmem<C, MT>::total;
  TREX_CUDA(cudaFuncSetAttribute(bwd_kernel<C, MT, MQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int qb = MQ ? int(16 * MT / H) : 1;
  dim3 grid(unsigned(MQ ? (N + qb - 1) / qb : N), unsigned(MQ ? 1 : (H + 16 * MT - 1) / (16 * MT)));
  bwd_kernel<C, MT, MQ><<<grid, 64 * MT, smem, s>>>(q, kv, cmp, sink, N, H, qb, keys, o, lse, do_, dq, dkv, dcmp,
                                                     part, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}

template <int C>
void bwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
           const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
           float* dcmp, float* part, cudaStream_t s) {
  switch (m_tiles(H)) {
    case 1:
      return launch_bwd<C, 1>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
    case 2:
      return launch_bwd<C, 2>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
    default:
      return launch_bwd<C, 4>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
  }
}

}  // namespace

bool supported(int64_t c) {
  return c == 256 || c == 512;
}

void fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s, FwdTiling tiling) {
  switch (tiling) {
    case FwdTiling::Keys64:
      if (c == 256) return fwd_c<256, 64, 2>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return fwd_c<512, 64, 2>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::MultiQuery:
      // 64 rows = floor(64 / H) queries x H heads (H <= 32; larger H has no room for a second query).
      if (H > 32) return fwd(q, kv, cmp, sink, N, H, c, keys, o, lse, s, FwdTiling::Keys32);
      if (c == 256) return launch_fwd<256, 4, 32, 8, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return launch_fwd<512, 4, 32, 8, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::Keys64Warps4:
      if (c == 256) return fwd_c<256, 64, 4>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return fwd_c<512, 64, 4>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    default:
      if (c == 256) return fwd_c<256, 32, 2>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return fwd_c<512, 32, 2>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  }
}

void bwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H, int64_t c,
         const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
         float* dcmp, float* dsink_part, cudaStream_t s, bool multi_query) {
  if (multi_query && H <= 32) {
    if (c == 256) return launch_bwd<256, 4, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
    return launch_bwd<512, 4, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  }
  if (c == 256) return bwd_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  return bwd_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
}

}  // namespace trex::cuda::mma_attn
