// The numbered versions of dev/attention/README.md (see sparse_variants.h): the mma.sync forward kernel of
// v2 - v5 and v8 - v10 (fwd_kernel, here only), and the other template configurations of the product's kernels
// (attention_sparse_mma.cuh). Compiled only by dev/attention/device.sh.
// fwd_kernel, per block = one query i and R = 16 * MT heads (MT m-tiles of 16 heads, W warps):
//   S phase   each warp computes S[16 heads of its m-tile][its keys of the tile] over the c dims (Q and the key
//             tile both from smem through ldmatrix);
//   softmax   2 W / MT threads per head row: online max / sum-exp over the tile, P (bf16) and the rescale factor
//             alpha to smem;
//   PV phase  warp w owns c / W output dims for all R heads: O = alpha O + P V (V = the same key tile, read
//             transposed with ldmatrix.trans).
#include "sparse_variants.h"

#include "kernels/cuda/attention_sparse_mma.cuh"

namespace trex::cuda::mma_attn::variants {
namespace {

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
template <int C, int MT, int KT, int W, bool MQ, bool PF = false>
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
  int64_t pf_n[KT / 32];  // PF: sources of tile + 1
  if constexpr (PF) {
    int64_t pf0[KT / 32];
    key_srcs<KT>(l, 0, pf0);
    key_srcs<KT>(l, KT, pf_n);
    load_tile_pf<C, T, KT>(pf0, kv, cmp, ks, srcs);
  } else {
    load_tile<C, T, KT>(l, 0, kv, cmp, ks, srcs);
  }
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
    if constexpr (PF) {
      int64_t pf_nn[KT / 32];
      key_srcs<KT>(l, int64_t(tile + 2) * KT, pf_nn);
      if (tile + 1 < n_tiles) load_tile_pf<C, T, KT>(pf_n, kv, cmp, ks + (buf ^ 1) * KT * (C + kPad), srcs + (buf ^ 1) * KT);
#pragma unroll
      for (int u = 0; u < KT / 32; ++u) pf_n[u] = pf_nn[u];
    } else if (tile + 1 < n_tiles) {
      load_tile<C, T, KT>(l, int64_t(tile + 1) * KT, kv, cmp, ks + (buf ^ 1) * KT * (C + kPad), srcs + (buf ^ 1) * KT);
    }
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

template <int C, int MT, int KT, int W, bool MQ = false, bool PF = false>
void launch_fwd(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
                const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  const size_t smem = FwdSmem<C, MT, KT>::total;
  TREX_CUDA(
      cudaFuncSetAttribute(fwd_kernel<C, MT, KT, W, MQ, PF>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int qb = MQ ? int(16 * MT / H) : 1;
  dim3 grid(unsigned(MQ ? (N + qb - 1) / qb : N), unsigned(MQ ? 1 : (H + 16 * MT - 1) / (16 * MT)));
  fwd_kernel<C, MT, KT, W, MQ, PF>
      <<<grid, 32 * W, smem, s>>>(q, kv, cmp, sink, N, H, qb, keys, o, lse, 1.f / sqrtf(float(C)));
  TREX_CUDA_LAUNCHED();
}

template <int C, int KT, int WPM, bool PF = false>  // WPM warps per m-tile
void fwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
           const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s) {
  switch (m_tiles(H)) {
    case 1:
      return launch_fwd<C, 1, KT, WPM, false, PF>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case 2:
      return launch_fwd<C, 2, KT, 2 * WPM, false, PF>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    default:
      return launch_fwd<C, 4, KT, 4 * WPM, false, PF>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  }
}

template <int C, bool PF = false>
void bwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
           const SparseKeySets& keys, const bf16* o, const float* lse, const bf16* do_, bf16* dq, float* dkv,
           float* dcmp, float* part, cudaStream_t s) {
  switch (m_tiles(H)) {
    case 1:
      return launch_bwd<C, 1, false, PF>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
    case 2:
      return launch_bwd<C, 2, false, PF>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
    default:
      return launch_bwd<C, 4, false, PF>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, part, s);
  }
}


template <int C>
void sd_fwd_c(const bf16* q, const bf16* kv, const bf16* cmp, const float* sink, int64_t N, int64_t H,
              const SparseKeySets& keys, bf16* o, float* lse, cudaStream_t s, int max_mt) {
  const int mt = std::min(m_tiles(H), max_mt);
  if (mt == 1) return launch_sd_fwd<C, 1>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  if (mt == 2) return launch_sd_fwd<C, 2>(q, kv, cmp, sink, N, H, keys, o, lse, s);
  return launch_sd_fwd<C, 4>(q, kv, cmp, sink, N, H, keys, o, lse, s);
}

}  // namespace

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
    case FwdTiling::Keys64Warps4Prefetch:
      if (c == 256) return fwd_c<256, 64, 4, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return fwd_c<512, 64, 4, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::Wgmma:
      if (c == 256) return launch_wg_fwd<256, false>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return launch_wg_fwd<512, false>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::WgmmaSplitS:
      if (c == 256) return launch_wg_fwd<256, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return launch_wg_fwd<512, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::Keys64Prefetch:
      if (c == 256) return fwd_c<256, 64, 2, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return fwd_c<512, 64, 2, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::MultiQueryPrefetch:
      if (H > 32) return fwd(q, kv, cmp, sink, N, H, c, keys, o, lse, s, FwdTiling::Keys64Warps4Prefetch);
      if (c == 256) return launch_fwd<256, 4, 32, 8, true, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
      return launch_fwd<512, 4, 32, 8, true, true>(q, kv, cmp, sink, N, H, keys, o, lse, s);
    case FwdTiling::SplitDims:
      if (c == 256) return sd_fwd_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, s, 4);
      return sd_fwd_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, s, 4);
    case FwdTiling::SplitDims32:
      if (c == 256) return sd_fwd_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, s, 2);
      return sd_fwd_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, s, 2);
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
         float* dcmp, float* dsink_part, cudaStream_t s, BwdTiling tiling) {
  if (tiling == BwdTiling::AtomicProd) {
    const BwdTiling t = H > 32 ? BwdTiling::Keys32Prefetch : keys.cmp_sel ? BwdTiling::SplitDims
                                                                          : BwdTiling::MultiQueryPrefetch;
    return bwd(q, kv, cmp, sink, N, H, c, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s, t);
  }
  if (tiling == BwdTiling::SplitDims || (tiling == BwdTiling::SplitDims32 && H <= 16)) {
    if (c == 256) return launch_sd_bwd<256, 1>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
    return launch_sd_bwd<512, 1>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  }
  if (tiling == BwdTiling::SplitDims32) {
    if (c == 256) return launch_sd_bwd<256, 2>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
    return launch_sd_bwd<512, 2>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  }
  if (tiling == BwdTiling::MultiQueryPrefetch && H <= 32) {
    if (c == 256) return launch_bwd<256, 4, true, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
    return launch_bwd<512, 4, true, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  }
  if (tiling == BwdTiling::Keys32Prefetch || tiling == BwdTiling::MultiQueryPrefetch) {
    if (c == 256) return bwd_c<256, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
    return bwd_c<512, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  }
  if (tiling == BwdTiling::MultiQuery && H <= 32) {
    if (c == 256) return launch_bwd<256, 4, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
    return launch_bwd<512, 4, true>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  }
  if (c == 256) return bwd_c<256>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
  return bwd_c<512>(q, kv, cmp, sink, N, H, keys, o, lse, do_, dq, dkv, dcmp, dsink_part, s);
}

}  // namespace trex::cuda::mma_attn::variants
