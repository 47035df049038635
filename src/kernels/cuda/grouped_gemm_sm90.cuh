// Hopper (sm_90a) grouped expert GEMMs: wgmma.mma_async (bf16 in, fp32 accumulate) on operands that TMA
// (cp.async.bulk.tensor, 128-byte swizzle) streams into a ring of shared-memory stages guarded by mbarriers.
// Warp-specialised and persistent: warpgroup 0 is the producer (one thread issues every TMA load), warpgroups
// 1 and 2 are consumers, each owning 64 rows of the 128 x BN block tile; a CTA per SM walks the tile list of
// (expert, m-tile, n-tile) with a stride of the grid, the producer running ahead into the next tile while the
// consumers store the previous one. The per-expert row offsets stay on the device: the row-grouped forms
// (fwd, dx) read the prefix of per-expert m-tile counts that tile_prefix_kernel writes, the weight gradient
// reads the offsets directly. The three forms, as (A, B) of D[M, N] = sum_k A[m, k] B[n, k]:
//   fwd  y  = x W_e^T        : A = x rows (K-major), B = W_e [out, in] (K-major)       M = rows of e, N = out
//   dx   dx = dy W_e         : A = dy rows (K-major), B = W_e [out, in] (N-major)      M = rows of e, N = in
//   dw   dW_e += dy_e^T x_e  : A = dy_e (M-major), B = x_e (N-major), K = rows of e    M = out,       N = in
// Activations are one row-major tensor map over all rows: a row tile that runs past its expert's last row
// reads the next expert's rows (or TMA's zero fill past the end), which only feeds output rows that the store
// masks. The dw K range is ragged: its last k-tile has the rows past the expert zeroed in shared memory
// before the wgmma reads them. Weights are a 3-D [E, out, in] tensor map, so a column tile past `out` / `in`
// is zero fill. Header-only (templates and static functions) so the dev benchmark and grouped_gemm.cu share
// one copy; no T-Rex headers: the host launchers return cudaError_t and the caller reports. grouped_gemm.cu
// instantiates one configuration (BN 256, 4 stages, no clusters, staged epilogue, dw by L2 reductions); the
// other template arguments (128-wide tiles, 3 or 6 stages, clusters of two, the direct epilogue, dw from the
// loaded dW tile) are the measured alternatives that dev/grouped_gemm/variants.cuh instantiates.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda::sm90 {

enum class Form { Fwd, Dx, Dw };

constexpr int kBM = 128, kBK = 64;    // block tile rows (two consumer warpgroups of 64) and k step
constexpr int kThreads = 384;         // producer warpgroup + two consumer warpgroups
constexpr int kChunk = 64 * kBK * 2;  // one 64 (MN) x 64 (K) bf16 box: 8 KiB, 128-byte rows

template <int BN, int STAGES>
struct Layout {
  static constexpr int kABytes = kBM * kBK * 2, kBBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kBarOffset = STAGES * kStageBytes;
  // Staged epilogue: per consumer warp, its 16 rows x 128 bytes of the output tile at a time (64 bf16 or 32
  // fp32 columns), rows padded to 160 bytes so the fragment writes hit distinct banks.
  static constexpr int kEpiRow = 160, kEpiWarp = 16 * kEpiRow;
  static constexpr int kEpiOffset = kBarOffset + 2 * STAGES * 8;
  static constexpr int kSmemDirect = kBarOffset + 2 * STAGES * 8 + 1024;  // + barriers + alignment slack
  static constexpr int kSmemStaged = kEpiOffset + 8 * kEpiWarp + 1024;
};

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TREX_SM90A 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same box into this offset of every CTA of the cluster in `mask`; each destination's barrier at `bar`
// counts the bytes it receives.
__device__ __forceinline__ void tma_load_2d_mc(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                               uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d_mc(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                               uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Arrival on the barrier at the same offset in cluster CTA `rank` (possibly this one).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// Shared-memory matrix descriptor with 128-byte swizzle. K-major tiles (rows of 64 k = 128 bytes): the
// leading offset is unused, 8-row groups 1024 bytes apart. MN-major tiles (64-wide MN chunks of 64 k-rows, 8
// KiB each): leading offset = the next 64 MN elements (one chunk), stride = the next 8 k-rows (1024 bytes).
__device__ __forceinline__ uint64_t desc_enc(uint32_t x) {
  return uint64_t((x & 0x3FFFF) >> 4);
}
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lead, uint32_t stride) {
  return desc_enc(addr) | (desc_enc(lead) << 16) | (desc_enc(stride) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void fence_acc(
    float (&d)[N]) {  // keeps the compiler from moving accumulator reads
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 256] (fp32, 128 registers per thread) (+)= A[64 x 16] B[16 x 256] from shared-memory descriptors.
template <int TransA, int TransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, "
      "%71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "
      "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, "
      "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, "
      "%126, %127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TransA), "n"(TransB));
}

// D[64 x 128] (fp32, 64 registers per thread) (+)= A[64 x 16] B[16 x 128] from shared-memory descriptors.
template <int TransA, int TransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
      "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
      "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TransA), "n"(TransB));
}

template <int BN, int TA, int TB>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (BN == 256)
    wgmma_m64n256k16<TA, TB>(d, da, db, accumulate);
  else
    wgmma_m64n128k16<TA, TB>(d, da, db, accumulate);
}

// One block tile of the walk: expert e, output rows row0 .. row_end (rows of e for fwd/dx, `out` for dw),
// columns col0 .., k range k0 .. k0 + k_len (k0 = the expert's first row for dw, 0 otherwise).
struct TileRef {
  int e;
  int row0, row_end, col0, k0, k_len;
};

struct Params {
  void* out;                  // bf16 y / dx, or fp32 dW
  const int32_t* offsets;     // [E + 1], device
  const int32_t* tile_start;  // [E + 1] prefix of m-tiles per expert (fwd / dx)
  int E, m, n, k;             // m = rows (fwd/dx) or out (dw); n = output columns; k = reduction (fwd/dx)
  int m_tiles, n_tiles;       // dw: per expert; fwd/dx: n_tiles only
  int n_group;                // fwd/dx: n-tiles per column group of the walk (n_tiles = plain m-major order)
};

// fwd / dx walk order: the n-tiles go in groups of `n_group` (launch's argument, used when it divides their
// count), each group over all m-tiles before the next, so that a wave of CTAs shares fewer weight tiles in L2;
// 0 = no grouping (n fastest over the whole row of tiles). kNGroup is the grouping grouped_gemm.cu runs: with 4,
// a wave of 132 CTAs holds ~33 m-tiles x 4 n-tiles instead of ~8 x 16, a quarter of an expert's weight in L2
// (dev/grouped_gemm/README.md has the measurements against 0 and 8).
constexpr int kNGroup = 4;

// Work units of the walk. Without clusters a unit is one tile (m-tile, n-tile; n fastest). Clusters of 2
// along N (ALONG_M false): a unit is an (m-tile, pair of n-tiles), CTA rank r taking n-tile 2 j + r. Along M:
// a unit is a (pair of m-tiles of one expert, n-tile), rank r taking m-tile 2 i + r; for fwd / dx the prefix
// then counts pairs per expert (tile_prefix_kernel with bm = 256), and an expert with an odd number of
// m-tiles leaves the second CTA of its last pair a tile past its rows (it still loads and multicasts its half
// of B; every store is masked).
template <Form F, int BN, int CL, bool ALONG_M>
__device__ __forceinline__ int64_t unit_count(const Params& p) {
  if constexpr (F == Form::Dw)
    return int64_t(p.E) * p.m_tiles * p.n_tiles / CL;
  else if constexpr (ALONG_M)
    return int64_t(p.tile_start[p.E]) * p.n_tiles;
  else
    return int64_t(p.tile_start[p.E]) * p.n_tiles / CL;
}

// The tile of CTA `rank` in unit u; false for a dw tile of an expert without rows (nothing to add).
template <Form F, int BN, int CL, bool ALONG_M>
__device__ __forceinline__ bool decode(const Params& p, int64_t u, uint32_t rank, TileRef& r) {
  if constexpr (F == Form::Dw) {
    int mt, nt;
    if constexpr (ALONG_M) {
      const int64_t per = int64_t(p.m_tiles / 2) * p.n_tiles;
      r.e = int(u / per);
      const int rem = int(u - int64_t(r.e) * per);
      mt = 2 * (rem / p.n_tiles) + int(rank), nt = rem % p.n_tiles;
    } else {
      const int64_t t = u * CL + rank, per = int64_t(p.m_tiles) * p.n_tiles;
      r.e = int(t / per);
      const int rem = int(t - int64_t(r.e) * per);
      mt = rem / p.n_tiles, nt = rem % p.n_tiles;
    }
    r.row0 = mt * kBM, r.row_end = p.m, r.col0 = nt * BN;
    r.k0 = p.offsets[r.e], r.k_len = p.offsets[r.e + 1] - r.k0;
    return r.k_len > 0;
  } else {
    int mt, nt;  // mt: an m-tile, or with ALONG_M a pair of m-tiles, counted over all experts
    if constexpr (ALONG_M) {
      mt = int(u / p.n_tiles), nt = int(u % p.n_tiles);
    } else {
      const int64_t t = u * CL + rank, per_group = int64_t(p.tile_start[p.E]) * p.n_group;
      const int g = int(t / per_group), rem = int(t - g * per_group);
      mt = rem / p.n_group, nt = g * p.n_group + rem % p.n_group;
    }
    int lo = 0, hi = p.E;  // the expert owning mt: the last e with tile_start[e] <= mt
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (p.tile_start[mid] <= mt)
        lo = mid;
      else
        hi = mid;
    }
    r.e = lo;
    const int local = ALONG_M ? 2 * (mt - p.tile_start[lo]) + int(rank) : mt - p.tile_start[lo];
    r.row0 = p.offsets[lo] + local * kBM, r.row_end = p.offsets[lo + 1];
    r.col0 = nt * BN, r.k0 = 0, r.k_len = p.k;
    return true;
  }
}

// CL = CTAs per cluster (1 or 2). Along N, the pair works on the two n-tiles of one m-tile, so both read the
// same A tile: each producer loads half of it and multicasts that half to both CTAs, halving A's L2 reads.
// Along M, the pair shares the B (weight) tile the same way. A stage is then free once the consumers of both
// CTAs released it (empty barriers count 2 * CL arrivals).
// STAGED: the epilogue goes through shared memory (per warp, 16 rows x 128 bytes at a time), so each global
// access is a whole 16-byte vector of one row and a warp covers whole 128-byte lines; otherwise every thread
// stores its accumulator pairs (4 or 8 bytes) straight from registers.
// DW_RED (dw only): the epilogue adds the tile to dW with fire-and-forget vector reductions in L2
// (red.global.add.v2/.v4.f32: each element gets exactly one addition per call, so the result is the same as a
// read-modify-write and deterministic); otherwise the accumulators start from the loaded dW tile and the
// epilogue stores.
template <Form F, int BN, int STAGES, int CL, bool ALONG_M, bool STAGED, bool DW_RED = false>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                         const Params p) {
#ifdef TREX_SM90A
  using L = Layout<BN, STAGES>;
  constexpr bool kAMN = F == Form::Dw, kBMN = F != Form::Fwd;  // operand stored MN-major (transposed)
  extern __shared__ unsigned char smem_raw[];
  // 128-byte swizzled TMA destinations and wgmma operands need 1024-byte alignment.
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t full_bar = base + L::kBarOffset, empty_bar = full_bar + STAGES * 8;
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);        // the producer's expect_tx arrival (+ the TMA bytes)
      mbar_init(empty_bar + 8 * s, 2 * CL);  // one arrival per consumer warpgroup of each CTA in the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (CL > 1)
    cluster_sync();  // the peer's multicasts and arrivals find initialised barriers
  else
    __syncthreads();
  // Tiles t = CL * u + rank for units u strided by the cluster count: n_tiles is a multiple of CL, so the
  // CTAs of a cluster share the m-tile (and expert) and take neighbouring n-tiles.
  const uint32_t rank = CL > 1 ? cluster_rank() : 0;
  const int64_t total = unit_count<F, BN, CL, ALONG_M>(p);
  const int64_t first = blockIdx.x / CL, stride = gridDim.x / CL;

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int s = 0;
      uint32_t phase = 0;
      // dw: the consumers start each tile by loading its current dW values into the accumulators. Pull the
      // tile of the unit after this one into L2 while this one runs (and the first one right away), so those
      // loads hit L2 instead of DRAM.
      const auto prefetch_dw = [&](int64_t pu) {
        TileRef q;
        if (pu >= total || !decode<F, BN, CL, ALONG_M>(p, pu, rank, q)) return;
        const float* g = static_cast<const float*>(p.out) + int64_t(q.e) * p.m * p.n + q.col0;
        const int cols = p.n - q.col0 < BN ? p.n - q.col0 : BN;
        for (int row = q.row0; row < q.row0 + kBM && row < p.m; ++row)
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(g + int64_t(row) * p.n),
                       "r"(cols * 4)
                       : "memory");
      };
      if constexpr (F == Form::Dw && !DW_RED) prefetch_dw(first);
      for (int64_t u = first; u < total; u += stride) {
        if constexpr (F == Form::Dw && !DW_RED) prefetch_dw(u + stride);
        TileRef r;
        if (!decode<F, BN, CL, ALONG_M>(p, u, rank, r)) continue;
        const int nk = (r.k_len + kBK - 1) / kBK;
        for (int kt = 0; kt < nk; ++kt) {
          mbar_wait(empty_bar + 8 * s, phase ^ 1);
          const uint32_t fb = full_bar + 8 * s;
          mbar_expect_tx(fb, L::kStageBytes);
          const uint32_t a = base + s * L::kStageBytes, b = a + L::kABytes;
          const int k = r.k0 + kt * kBK;
          if constexpr (CL > 1 && !ALONG_M) {  // this CTA's 64-row half of A, to both CTAs
            if constexpr (F == Form::Dw)
              tma_load_2d_mc(a + rank * kChunk, &map_a, r.row0 + 64 * rank, k, fb, 0x3);
            else
              tma_load_2d_mc(a + rank * kChunk, &map_a, k, r.row0 + 64 * rank, fb, 0x3);
          } else if constexpr (F == Form::Dw) {
#pragma unroll
            for (int c = 0; c < kBM / 64; ++c) tma_load_2d(a + c * kChunk, &map_a, r.row0 + 64 * c, k, fb);
          } else {
            tma_load_2d(a, &map_a, k, r.row0, fb);
          }
          if constexpr (CL > 1 && ALONG_M) {    // this CTA's half of B, to both CTAs
            constexpr int kHalf = BN / 64 / 2;  // 64-wide N chunks per CTA (N-major B)
            if constexpr (F == Form::Fwd) {
              tma_load_3d_mc(b + rank * (BN / 2) * 128, &map_b, k, r.col0 + int(rank) * (BN / 2), r.e, fb,
                             0x3);
            } else {
#pragma unroll
              for (int c = int(rank) * kHalf; c < (int(rank) + 1) * kHalf; ++c) {
                if constexpr (F == Form::Dw)
                  tma_load_2d_mc(b + c * kChunk, &map_b, r.col0 + 64 * c, k, fb, 0x3);
                else
                  tma_load_3d_mc(b + c * kChunk, &map_b, r.col0 + 64 * c, k, r.e, fb, 0x3);
              }
            }
          } else if constexpr (F == Form::Dw) {
#pragma unroll
            for (int c = 0; c < BN / 64; ++c) tma_load_2d(b + c * kChunk, &map_b, r.col0 + 64 * c, k, fb);
          } else {
            if constexpr (F == Form::Fwd) {
              tma_load_3d(b, &map_b, k, r.col0, r.e, fb);
            } else {
#pragma unroll
              for (int c = 0; c < BN / 64; ++c)
                tma_load_3d(b + c * kChunk, &map_b, r.col0 + 64 * c, k, r.e, fb);
            }
          }
          if (++s == STAGES) s = 0, phase ^= 1;
        }
      }
    }
    __syncwarp();
  } else {
    // consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = wg - 1, tw = threadIdx.x % 128, warp = tw / 32, lane = tw % 32;
    int s = 0;
    uint32_t phase = 0;
    float acc[BN / 2];
    // Hands stage `st` back to the producer of every CTA in the cluster.
    const auto release = [&](int st) {
      if (tw != 0) return;
      if constexpr (CL > 1) {
        for (uint32_t c = 0; c < CL; ++c) mbar_arrive_cluster(empty_bar + 8 * st, c);
      } else {
        mbar_arrive(empty_bar + 8 * st);
      }
    };
    for (int64_t u = first; u < total; u += stride) {
      TileRef r;
      if (!decode<F, BN, CL, ALONG_M>(p, u, rank, r)) continue;
      const int nk = (r.k_len + kBK - 1) / kBK;
      int prev = 0;
      // Accumulator layout of m64nN: thread (warp w, lane l) holds rows 16 w + l / 4 (+ 8), columns 8 j + 2
      // (l % 4).
      const int rbase = r.row0 + cw * 64 + warp * 16 + lane / 4;
      constexpr bool kAccInit = F == Form::Dw && !DW_RED;
      if constexpr (kAccInit) {
        // dW += ...: the accumulators start from the current gradient (all loads in flight at once, one
        // latency, the tile pulled into L2 by the producer one tile ahead), so the epilogue only stores.
        const float* g = static_cast<const float*>(p.out) + int64_t(r.e) * p.m * p.n;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int c = r.col0 + 8 * j + 2 * (lane % 4);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = rbase + 8 * h;
            float2 v = make_float2(0.f, 0.f);
            if (row < r.row_end && c < p.n) v = *reinterpret_cast<const float2*>(g + int64_t(row) * p.n + c);
            acc[4 * j + 2 * h] = v.x, acc[4 * j + 2 * h + 1] = v.y;
          }
        }
      }
      fence_acc(acc);
      for (int kt = 0; kt < nk; ++kt) {
        mbar_wait(full_bar + 8 * s, phase);
        const uint32_t a = base + s * L::kStageBytes + cw * kChunk,
                       b = base + s * L::kStageBytes + L::kABytes;
        if constexpr (F == Form::Dw) {
          const int valid = r.k_len - kt * kBK;
          if (valid < kBK) {
            // Zero the k-rows past the expert: this warpgroup's A chunk and half of the B chunks.
            constexpr int kBChunks = BN / 64 / 2;
            const int units = (kBK - valid) * 8;  // 16-byte units per chunk
            for (int i = tw; i < units * (1 + kBChunks); i += 128) {
              const int c = i / units, q = i % units;
              const uint32_t chunk = c == 0 ? a : b + (cw * kBChunks + c - 1) * kChunk;
              asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(chunk + valid * 128 + q * 16),
                           "r"(0)
                           : "memory");
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            asm volatile("bar.sync 1, 256;\n" ::: "memory");
          }
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t da =
              kAMN ? make_desc(a + kk * 2048, kChunk, 1024) : make_desc(a + kk * 32, 16, 1024);
          const uint64_t db =
              kBMN ? make_desc(b + kk * 2048, kChunk, 1024) : make_desc(b + kk * 32, 16, 1024);
          wgmma_tile<BN, kAMN ? 1 : 0, kBMN ? 1 : 0>(acc, da, db, kAccInit || (kt | kk) != 0);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's products are done: hand that stage back
        if (kt > 0) release(prev);
        prev = s;
        if (++s == STAGES) s = 0, phase ^= 1;
      }
      wgmma_wait<0>();
      fence_acc(acc);
      release(prev);

      if constexpr (STAGED) {
        // Per 128-byte column chunk: fragments -> this warp's buffer, then each lane moves 16-byte vectors of
        // whole rows (8 lanes per row).
        constexpr bool kF32 = F == Form::Dw;
        constexpr int kCols = kF32 ? 32 : 64, kBlocks = kCols / 8;  // columns and n8 blocks per chunk
        const uint32_t buf = base + L::kEpiOffset + (cw * 4 + warp) * L::kEpiWarp;
        const int row_w = r.row0 + cw * 64 + warp * 16;  // this warp's first row
#pragma unroll
        for (int ch = 0; ch < BN / kCols; ++ch) {
#pragma unroll
          for (int jj = 0; jj < kBlocks; ++jj) {
            const int j = ch * kBlocks + jj;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t at = buf + (lane / 4 + 8 * h) * L::kEpiRow;
              const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
              if constexpr (kF32) {
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at + jj * 32 + (lane % 4) * 8),
                             "f"(v0), "f"(v1)
                             : "memory");
              } else {
                __nv_bfloat162 b2 = __floats2bfloat162_rn(v0, v1);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + jj * 16 + (lane % 4) * 4),
                             "r"(*reinterpret_cast<uint32_t*>(&b2))
                             : "memory");
              }
            }
          }
          __syncwarp();
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int rr = 4 * i + lane / 8, unit = lane % 8;
            const int row = row_w + rr, c = r.col0 + ch * kCols + unit * (kF32 ? 4 : 8);
            uint4 v;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(buf + rr * L::kEpiRow + unit * 16));
            if (row < r.row_end && c < p.n) {
              if constexpr (kF32) {
                float* q = static_cast<float*>(p.out) + int64_t(r.e) * p.m * p.n + int64_t(row) * p.n + c;
                if constexpr (DW_RED)
                  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(q),
                               "f"(__uint_as_float(v.x)), "f"(__uint_as_float(v.y)),
                               "f"(__uint_as_float(v.z)), "f"(__uint_as_float(v.w))
                               : "memory");
                else
                  *reinterpret_cast<uint4*>(q) = v;
              } else {
                *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + int64_t(row) * p.n + c) = v;
              }
            }
          }
          __syncwarp();
        }
      } else if constexpr (F == Form::Dw) {
        float* out = static_cast<float*>(p.out) + int64_t(r.e) * p.m * p.n;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int c = r.col0 + 8 * j + 2 * (lane % 4);
          if (c >= p.n) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = rbase + 8 * h;
            if (row < r.row_end) {
              float* q = out + int64_t(row) * p.n + c;
              if constexpr (DW_RED)
                asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(q), "f"(acc[4 * j + 2 * h]),
                             "f"(acc[4 * j + 2 * h + 1])
                             : "memory");
              else
                *reinterpret_cast<float2*>(q) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            }
          }
        }
      } else {
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int c = r.col0 + 8 * j + 2 * (lane % 4);
          if (c >= p.n) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = rbase + 8 * h;
            if (row < r.row_end)
              *reinterpret_cast<__nv_bfloat162*>(out + int64_t(row) * p.n + c) =
                  __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
          }
        }
      }
    }
  }
  // A CTA leaves only when its peer no longer multicasts into it or arrives on its barriers.
  if constexpr (CL > 1) cluster_sync();
#else
  __trap();  // built for an architecture without wgmma: the host side never launches this
#endif
}

// tile_start[e] = sum over e' < e of ceil(rows_e' / bm); tile_start[E] = the m-tiles in use. One block of
// kPrefixThreads threads scans kPrefixThreads experts at a time (warp shuffles, then the warp totals).
constexpr int kPrefixThreads = 1024;
static __global__ void __launch_bounds__(kPrefixThreads)
    tile_prefix_kernel(const int32_t* offsets, int E, int bm, int32_t* tile_start) {
  __shared__ int32_t warp_sum[kPrefixThreads / 32];
  __shared__ int32_t carry;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) carry = 0;
  for (int base = 0; base < E; base += kPrefixThreads) {
    const int e = base + int(threadIdx.x);
    const int32_t own = e < E ? (offsets[e + 1] - offsets[e] + bm - 1) / bm : 0;
    int32_t v = own;  // inclusive scan within the warp
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t t = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += t;
    }
    if (lane == 31) warp_sum[warp] = v;
    __syncthreads();  // also orders the carry written by the previous round
    if (warp == 0) {
      int32_t w = warp_sum[lane];
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t t = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += t;
      }
      warp_sum[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int32_t incl = carry + v + (warp > 0 ? warp_sum[warp - 1] : 0);
    if (e < E) tile_start[e] = incl - own;
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == kPrefixThreads - 1) carry = incl;
  }
  __syncthreads();
  if (threadIdx.x == 0) tile_start[E] = carry;
}

// --- host ---

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                   CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                   CUtensorMapFloatOOBfill);

static inline EncodeTiledFn encode_fn() {
  static EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A bf16 tensor map of rank 2 or 3 (dims innermost first, row strides in elements), box `box`, 128-byte
// swizzle, zero fill out of bounds.
static inline bool make_map(CUtensorMap* m, const void* ptr, int rank, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box) {
  const EncodeTiledFn fn = encode_fn();
  if (!fn) return false;
  cuuint64_t d[3], st[2];
  cuuint32_t bx[3], es[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) d[i] = dims[i], bx[i] = box[i];
  for (int i = 0; i < rank - 1; ++i) st[i] = strides[i] * 2;
  return fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, cuuint32_t(rank), const_cast<void*>(ptr), d, st, bx, es,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static inline int sm_count() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n > 0 ? n : 132;
}

// True when this device runs the sm90 kernels (compute capability 9.0) and the driver can encode tensor maps.
static inline bool available() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0 && encode_fn() != nullptr;
}

// Whether the N extent splits into whole pairs of BN-wide tiles (the cluster-of-2 variants).
static inline bool cluster_ok(int64_t n, int bn) {
  return ((n + bn - 1) / bn) % 2 == 0;
}

// Shapes the sm90 path takes: 16-byte aligned operands and rows (in, out multiples of 8), int32 coordinates.
static inline bool supported(const void* a, const void* b, int64_t rows, int64_t in, int64_t out, int64_t E) {
  const auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return al(a) && al(b) && in % 8 == 0 && out % 8 == 0 && rows < (int64_t(1) << 31) &&
         in * out * E < (int64_t(1) << 40) && in < (1 << 30) && out < (1 << 30);
}

// For fwd / dx, tile_start must hold tile_prefix_kernel's prefix with bm = prefix_rows<CL, ALONG_M>().
template <int CL, bool ALONG_M>
constexpr int prefix_rows() {
  return CL > 1 && ALONG_M ? 2 * kBM : kBM;
}

template <Form F, int BN, int STAGES, int CL = 1, bool ALONG_M = false, bool STAGED = false,
          bool DW_RED = false>
cudaError_t launch(void* out, const __nv_bfloat16* a, const __nv_bfloat16* b, const int32_t* offsets,
                   const int32_t* tile_start, int64_t E, int64_t rows, int64_t in, int64_t out_dim,
                   cudaStream_t stream, int n_group = kNGroup) {
  using L = Layout<BN, STAGES>;
  CUtensorMap ma, mb;
  Params p{};
  p.out = out, p.offsets = offsets, p.tile_start = tile_start, p.E = int(E);
  int64_t bound = 0;
  bool ok = true;
  if constexpr (F == Form::Fwd) {  // A = x [rows, in], B = W [E, out, in]; N = out, K = in
    const uint64_t da[2] = {uint64_t(in), uint64_t(rows)}, sa[1] = {uint64_t(in)};
    const uint32_t ba[2] = {kBK, ALONG_M ? kBM : kBM / CL};
    const uint64_t db[3] = {uint64_t(in), uint64_t(out_dim), uint64_t(E)},
                   sb[2] = {uint64_t(in), uint64_t(in * out_dim)};
    const uint32_t bb[3] = {kBK, ALONG_M ? BN / CL : BN, 1};
    ok = make_map(&ma, a, 2, da, sa, ba) && make_map(&mb, b, 3, db, sb, bb);
    p.m = int(rows), p.n = int(out_dim), p.k = int(in);
  } else if constexpr (F == Form::Dx) {  // A = dy [rows, out], B = W [E, out, in] N-major; N = in, K = out
    const uint64_t da[2] = {uint64_t(out_dim), uint64_t(rows)}, sa[1] = {uint64_t(out_dim)};
    const uint32_t ba[2] = {kBK, ALONG_M ? kBM : kBM / CL};
    const uint64_t db[3] = {uint64_t(in), uint64_t(out_dim), uint64_t(E)},
                   sb[2] = {uint64_t(in), uint64_t(in * out_dim)};
    const uint32_t bb[3] = {64, kBK, 1};
    ok = make_map(&ma, a, 2, da, sa, ba) && make_map(&mb, b, 3, db, sb, bb);
    p.m = int(rows), p.n = int(in), p.k = int(out_dim);
  } else {  // A = dy [rows, out] M-major, B = x [rows, in] N-major; M = out, N = in, K = rows of e
    const uint64_t da[2] = {uint64_t(out_dim), uint64_t(rows)}, sa[1] = {uint64_t(out_dim)};
    const uint64_t db[2] = {uint64_t(in), uint64_t(rows)}, sb[1] = {uint64_t(in)};
    const uint32_t bx[2] = {64, kBK};
    ok = make_map(&ma, a, 2, da, sa, bx) && make_map(&mb, b, 2, db, sb, bx);
    p.m = int(out_dim), p.n = int(in), p.k = 0;
    p.m_tiles = int((out_dim + kBM - 1) / kBM);
  }
  if (!ok) return cudaErrorInvalidValue;
  p.n_tiles = int((p.n + BN - 1) / BN);
  p.n_group = n_group > 0 && n_group % CL == 0 && p.n_tiles % n_group == 0 ? n_group : p.n_tiles;
  // The caller checks cluster_ok() first: along N the n-tiles pair up; along M, dw's m-tiles of `out` do.
  if (!ALONG_M && p.n_tiles % CL != 0) return cudaErrorInvalidValue;
  if (F == Form::Dw && ALONG_M && p.m_tiles % CL != 0) return cudaErrorInvalidValue;
  if constexpr (F == Form::Dw)
    bound = E * p.m_tiles * p.n_tiles;
  else
    bound = ((rows + kBM - 1) / kBM + 2 * E) * p.n_tiles;  // + E partial tiles, + E odd pair members
  auto kern = grouped_wgmma_kernel<F, BN, STAGES, CL, ALONG_M, STAGED, DW_RED>;
  constexpr int kSmem = STAGED ? L::kSmemStaged : L::kSmemDirect;
  static_assert(kSmem <= 227 * 1024, "shared memory per block");
  cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = kSmem, cfg.stream = stream;
  cfg.attrs = attr, cfg.numAttrs = 1;
  // Persistent: as many CTAs as fit at once (for clusters, as many whole clusters as the GPCs hold).
  int slots = sm_count();
  if constexpr (CL > 1) {
    static int clusters = 0;  // per process: one device model
    if (clusters == 0) {
      cfg.gridDim = dim3(unsigned(sm_count() / CL * CL));
      if (cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg) != cudaSuccess || clusters <= 0) {
        cudaGetLastError();
        clusters = sm_count() / CL / 2;  // conservative
      }
    }
    slots = clusters * CL;
  }
  bound = (bound + CL - 1) / CL * CL;
  const int grid = int(bound < slots ? bound : slots);
  if (grid <= 0) return cudaSuccess;
  cfg.gridDim = dim3(unsigned(grid));
  err = cudaLaunchKernelEx(&cfg, kern, ma, mb, p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace trex::cuda::sm90
