// The mma.sync grouped expert GEMM kernels (the fallback of grouped_gemm.cu where the Hopper kernel of
// grouped_gemm_sm90.cuh does not run): mma.sync m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix from a
// cp.async pipeline of kStages shared-memory stages. One main loop serves the three products; they differ only
// in how each operand sits in memory:
//   fwd  y  = x  W_e^T : A = x  [r, in]  (K-major), B = W_e [out, in] (K-major), rows grouped (M varies)
//   dx   dx = dy W_e   : A = dy [r, out] (K-major), B = W_e [out, in] (N-major), rows grouped (M varies)
//   dw   dW_e += dy_e^T x_e : A = dy (M-major, k = row), B = x (N-major, k = row), reduction grouped (K varies)
// K-major tiles are stored [rows][kBK + 8] and read with ldmatrix; M/N-major tiles [kBK][cols + 8] and read
// with ldmatrix.trans. The 16-byte row padding keeps both conflict-free. Out-of-range 16-byte chunks are
// zero-filled by cp.async (src-size 0), so any row count works; in/out need to be multiples of 8 and the
// operands 16-byte aligned.
// Internal: templates over the tile configuration, so that grouped_gemm.cu instantiates the configurations it
// dispatches to and dev/grouped_gemm the measured alternatives from this one copy. No T-Rex headers (the dev
// benchmark builds without the library): the launchers return cudaError_t and the caller reports.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/grouped_gemm_sm90.cuh"  // tile_prefix_kernel

namespace trex::cuda::mma_gg {

using bf16 = __nv_bfloat16;

// Tile configuration: block tile kBM x kBN x kBK, warp tile kWM x kWN, kStages pipeline stages.
template <int BM, int BN, int BK, int WM, int WN, int STAGES, int MIN_BLOCKS>
struct Cfg {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kWM = WM, kWN = WN, kStages = STAGES;
  static constexpr int kMinBlocks = MIN_BLOCKS;  // resident blocks per SM the register budget aims for
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kMI = WM / 16, kNI = WN / 8;  // mma tiles per warp
  static_assert(kNI % 2 == 0, "B fragments load two n8 tiles at a time");
};
constexpr int kPad = 8;

// Elements of one operand tile in shared memory (R = the tile's M or N extent).
template <class C, bool KMajor, int R>
struct SmemTile {
  static constexpr int kLd = KMajor ? C::kBK + kPad : R + kPad;
  static constexpr int kElems = KMajor ? R * kLd : C::kBK * kLd;
};

template <class C, bool AK, bool BK_>
constexpr size_t smem_bytes() {
  return size_t(C::kStages) * (SmemTile<C, AK, C::kBM>::kElems + SmemTile<C, BK_, C::kBN>::kElems) * sizeof(bf16);
}

__device__ inline void cp_async16(void* smem, const void* g, bool ok) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  const int n = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ inline void ldmatrix_x4(uint32_t* r, const bf16* p) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ inline void ldmatrix_x4_trans(uint32_t* r, const bf16* p) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ inline void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Copies one R x kBK operand tile to shared memory. Element (r, k) of the operand is g[r * ld + k] (K-major)
// or g[k * ld + r] (M/N-major); r is valid below r_end, k below k_end.
template <class C, bool KMajor, int R>
__device__ inline void load_tile(bf16* s, const bf16* g, int64_t ld, int64_t r0, int64_t r_end, int64_t k0,
                                 int64_t k_end, int tid) {
  using T = SmemTile<C, KMajor, R>;
  constexpr int kBK = C::kBK, kThreads = C::kThreads;
  if constexpr (KMajor) {
    constexpr int kCpr = kBK / 8, kChunks = R * kCpr;
    static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
    for (int j = 0; j < kChunks / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int r = i / kCpr, c = i % kCpr;
      const int64_t gr = r0 + r, gk = k0 + c * 8;
      const bool ok = gr < r_end && gk < k_end;
      cp_async16(s + r * T::kLd + c * 8, ok ? g + gr * ld + gk : g, ok);
    }
  } else {
    constexpr int kCpr = R / 8, kChunks = kBK * kCpr;
    static_assert(kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
    for (int j = 0; j < kChunks / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int k = i / kCpr, c = i % kCpr;
      const int64_t gr = r0 + c * 8, gk = k0 + k;
      const bool ok = gr < r_end && gk < k_end;
      cp_async16(s + k * T::kLd + c * 8, ok ? g + gk * ld + gr : g, ok);
    }
  }
}

// acc[mi][ni][4] += A[a_r0.., k_begin..k_end) B[b_r0.., same k]^T over the block tile; operand rows beyond
// a_end / b_end read as zero.
template <class C, bool AK, bool BK_>
__device__ inline void mainloop(bf16* smem, const bf16* A, int64_t lda, int64_t a_r0, int64_t a_end,
                                const bf16* B, int64_t ldb, int64_t b_r0, int64_t b_end, int64_t k_begin,
                                int64_t k_end, float (&acc)[C::kMI][C::kNI][4]) {
  constexpr int kBM = C::kBM, kBN = C::kBN, kBK = C::kBK, kWM = C::kWM, kWN = C::kWN, kStages = C::kStages;
  constexpr int kMI = C::kMI, kNI = C::kNI, kWarpsN = C::kWarpsN;
  using TA = SmemTile<C, AK, kBM>;
  using TB = SmemTile<C, BK_, kBN>;
  bf16* sA = smem;
  bf16* sB = smem + kStages * TA::kElems;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
  const int64_t nk = (k_end - k_begin + kBK - 1) / kBK;

  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t k0 = k_begin + kt * kBK;
    load_tile<C, AK, kBM>(sA + stage * TA::kElems, A, lda, a_r0, a_end, k0, k_end, tid);
    load_tile<C, BK_, kBN>(sB + stage * TB::kElems, B, ldb, b_r0, b_end, k0, k_end, tid);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(s, s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; stage kt-1 is no longer read by anyone
    const int64_t next = kt + kStages - 1;
    if (next < nk) load_stage(int(next % kStages), next);
    cp_async_commit();
    const bf16* a = sA + int(kt % kStages) * TA::kElems;
    const bf16* b = sB + int(kt % kStages) * TB::kElems;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[kMI][4], bfr[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
        const int m0 = wm * kWM + mi * 16;
        if constexpr (AK)
          ldmatrix_x4(af[mi], a + (m0 + lane % 16) * TA::kLd + kk + (lane / 16) * 8);
        else
          ldmatrix_x4_trans(af[mi], a + (kk + lane % 8 + (lane / 16) * 8) * TA::kLd + m0 + ((lane / 8) % 2) * 8);
      }
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {
        const int n0 = wn * kWN + nj * 16;
        uint32_t r[4];
        if constexpr (BK_)
          ldmatrix_x4(r, b + (n0 + lane % 8 + (lane / 16) * 8) * TB::kLd + kk + ((lane / 8) % 2) * 8);
        else
          ldmatrix_x4_trans(r, b + (kk + lane % 8 + ((lane / 8) % 2) * 8) * TB::kLd + n0 + (lane / 16) * 8);
        bfr[2 * nj][0] = r[0], bfr[2 * nj][1] = r[1];
        bfr[2 * nj + 1][0] = r[2], bfr[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma_bf16(acc[mi][ni], af[mi], bfr[ni]);
    }
  }
  cp_async_wait<0>();
}

// Row-grouped product (fwd / dx): block = (m-tile over all experts, n-tile), n-tile fastest so neighbours share
// the A rows. BKMajor: W_e is [n, k] (fwd) or [k, n] (dx).
template <class C, bool BKMajor>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) grouped_rows_kernel(bf16* y, const bf16* x, const bf16* W,
                                                                const int32_t* offsets,
                                                                const int32_t* tile_start, int E, int64_t n,
                                                                int64_t k, int n_tiles) {
  constexpr int kBM = C::kBM, kBN = C::kBN, kWM = C::kWM, kWN = C::kWN, kMI = C::kMI, kNI = C::kNI;
  constexpr int kWarpsN = C::kWarpsN;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int nt = int(blockIdx.x % unsigned(n_tiles));
  const int mt = int(blockIdx.x / unsigned(n_tiles));
  if (mt >= tile_start[E]) return;
  int lo = 0, hi = E;  // the expert owning m-tile mt: the last e with tile_start[e] <= mt
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (tile_start[mid] <= mt) lo = mid;
    else hi = mid;
  }
  const int e = lo;
  const int64_t row0 = offsets[e] + int64_t(mt - tile_start[e]) * kBM, row_end = offsets[e + 1];
  const int64_t col0 = int64_t(nt) * kBN;
  const bf16* We = W + int64_t(e) * n * k;

  float acc[kMI][kNI][4] = {};
  mainloop<C, true, BKMajor>(reinterpret_cast<bf16*>(smem_raw), x, k, row0, row_end, We, BKMajor ? k : n, col0, n,
                          0, k, acc);

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni) {
      const int64_t c = col0 + wn * kWN + ni * 8 + (lane % 4) * 2;
      if (c >= n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + wm * kWM + mi * 16 + lane / 4 + h * 8;
        if (r < row_end)
          *reinterpret_cast<__nv_bfloat162*>(y + r * n + c) =
              __floats2bfloat162_rn(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }
    }
}

// Reduction-grouped weight gradient: block = (expert, m-tile of out, n-tile of in), n-tile fastest.
template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) grouped_dw_kernel(float* dW, const bf16* dy, const bf16* x,
                                                              const int32_t* offsets, int64_t m, int64_t n,
                                                              int m_tiles, int n_tiles) {
  constexpr int kBM = C::kBM, kBN = C::kBN, kWM = C::kWM, kWN = C::kWN, kMI = C::kMI, kNI = C::kNI;
  constexpr int kWarpsN = C::kWarpsN;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t per_e = int64_t(m_tiles) * n_tiles;
  const int e = int(blockIdx.x / per_e);
  const int mt = int((blockIdx.x % per_e) / n_tiles), nt = int(blockIdx.x % n_tiles);
  const int64_t k_begin = offsets[e], k_end = offsets[e + 1];
  if (k_end <= k_begin) return;
  const int64_t row0 = int64_t(mt) * kBM, col0 = int64_t(nt) * kBN;

  float acc[kMI][kNI][4] = {};
  mainloop<C, false, false>(reinterpret_cast<bf16*>(smem_raw), dy, m, row0, m, x, n, col0, n, k_begin, k_end, acc);

  float* out = dW + int64_t(e) * m * n;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNI; ++ni) {
      const int64_t c = col0 + wn * kWN + ni * 8 + (lane % 4) * 2;
      if (c >= n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + wm * kWM + mi * 16 + lane / 4 + h * 8;
        if (r < m) {
          float2* p = reinterpret_cast<float2*>(out + r * n + c);
          float2 v = *p;
          v.x += acc[mi][ni][2 * h];
          v.y += acc[mi][ni][2 * h + 1];
          *p = v;
        }
      }
    }
}


// fwd (BKMajor) / dx: y[rows, n] = x[rows, k] W_e^T (W_e [n, k]) or x W_e (W_e [k, n]); scratch holds E + 1
// int32 (the m-tile prefix).
template <class C, bool BKMajor>
cudaError_t launch_rows(bf16* y, const bf16* x, const bf16* W, const int32_t* offsets, int64_t E, int64_t rows,
                        int64_t n, int64_t k, int32_t* scratch, cudaStream_t stream) {
  constexpr size_t smem = smem_bytes<C, true, BKMajor>();
  // Per launch: the attribute belongs to the current device's context, and setting it costs next to nothing.
  cudaError_t err = cudaFuncSetAttribute(grouped_rows_kernel<C, BKMajor>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  sm90::tile_prefix_kernel<<<1, sm90::kPrefixThreads, 0, stream>>>(offsets, int(E), C::kBM, scratch);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const int64_t n_tiles = (n + C::kBN - 1) / C::kBN;
  const int64_t m_bound = (rows + C::kBM - 1) / C::kBM + E;  // each expert adds at most one partial tile
  const int64_t blocks = m_bound * n_tiles;
  if (blocks >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;  // more blocks than a grid holds
  grouped_rows_kernel<C, BKMajor><<<unsigned(blocks), C::kThreads, smem, stream>>>(y, x, W, offsets, scratch,
                                                                                  int(E), n, k, int(n_tiles));
  return cudaGetLastError();
}

// dw: dW_e[out, in] += dy_e^T x_e.
template <class C>
cudaError_t launch_dw(float* dW, const bf16* dy, const bf16* x, const int32_t* offsets, int64_t E, int64_t in,
                      int64_t out, cudaStream_t stream) {
  constexpr size_t smem = smem_bytes<C, false, false>();
  cudaError_t err =
      cudaFuncSetAttribute(grouped_dw_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const int64_t m_tiles = (out + C::kBM - 1) / C::kBM, n_tiles = (in + C::kBN - 1) / C::kBN;
  const int64_t blocks = E * m_tiles * n_tiles;
  if (blocks >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  grouped_dw_kernel<C><<<unsigned(blocks), C::kThreads, smem, stream>>>(dW, dy, x, offsets, out, in,
                                                                        int(m_tiles), int(n_tiles));
  return cudaGetLastError();
}

}  // namespace trex::cuda::mma_gg
