// The deterministic dK + dV reduction of the sparse attention backward (attention_dkv_reduce.h).
#include "kernels/cuda/attention_dkv_reduce.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdio>

#include "kernels/cuda/attention_keys.cuh"
#include "kernels/cuda/cuda_check.h"

namespace trex::cuda::dkv_reduce {
namespace {

constexpr int kThreads = 128;
constexpr int kDimsPerThread = 4;  // one pass of the reduction covers kThreads * 4 = 512 dims
constexpr int kBatch = 8;          // partial rows loaded before they are added (in order)

size_t align256(size_t x) {
  return (x + 255) & ~size_t(255);
}

// Pair (u, j) -> its destination row: kv row r, or N + e for compressed entry e; N + E (sorts last) for no key. The
// slots follow the kernels' key lists (attention_keys.cuh): key_list for one query, union_key_list for qb > 1.
__global__ void enumerate_kernel(SparseKeySets keys, int64_t N, int64_t E, int qb, int64_t n_slots, int32_t* key,
                                 int32_t* val) {
  const int64_t u = blockIdx.x, i0 = u * qb;
  const int nq = int(min(int64_t(qb), N - i0));
  const attn_keys::KeyList l = attn_keys::union_key_list(keys, i0, nq);  // = key_list(keys, i0) when nq = 1
  if (l.size() > n_slots) {
    if (threadIdx.x == 0)
      printf("sparse attention backward: queries %lld..%lld have %lld keys, more than the %lld slots sized from "
             "SparseKeySets.max_win (a query's window exceeds max_win)\n",
             (long long)i0, (long long)(i0 + nq - 1), (long long)l.size(), (long long)n_slots);
    __trap();
  }
  const int32_t none = int32_t(N + E);
  for (int64_t j = threadIdx.x; j < n_slots; j += blockDim.x) {
    int32_t k = none;
    if (j < l.n_win) {
      k = int32_t(l.win_begin + j);
    } else if (j < l.size()) {
      const int64_t s = j - l.n_win, e = l.sel ? l.sel[s] : l.cmp_begin + s;
      if (e >= E) {
        printf("sparse attention backward: query block %lld selects compressed entry %lld of %lld\n",
               (long long)i0, (long long)e, (long long)E);
        __trap();
      }
      if (e >= 0) k = int32_t(N + e);
    }
    key[u * n_slots + j] = k;
    val[u * n_slots + j] = int32_t(u * n_slots + j);
  }
}

__device__ __forceinline__ int32_t lower_bound(const int32_t* a, int32_t lo, int32_t hi, int64_t x) {
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (a[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// row_start[r] = the first sorted pair whose row is >= r, r = 0 .. n_rows.
__global__ void row_start_kernel(const int32_t* sorted_keys, int32_t n_pairs, int64_t n_rows, int32_t* row_start) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r <= n_rows; r += int64_t(gridDim.x) * blockDim.x)
    row_start[r] = lower_bound(sorted_keys, 0, n_pairs, r);
}

// One block per destination row: kv rows r_lo + b for b < n_kv, then the E compressed entries. The row's pairs of
// units [u0, u1) are a contiguous run of its sorted list; their partials (G per pair) are summed in list order
// (batches of kBatch pairs, head group by head group within a batch), then added to the row once.
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(const float* __restrict__ part, const int32_t* __restrict__ vals,
                  const int32_t* __restrict__ row_start, int64_t N, int64_t n_slots, int64_t G, int64_t c,
                  int64_t u0, int64_t u1, int64_t r_lo, int64_t n_kv, float* dkv, float* dcmp) {
  const int64_t r = int64_t(blockIdx.x) < n_kv ? r_lo + blockIdx.x : N + (int64_t(blockIdx.x) - n_kv);
  const int32_t a = row_start[r], b = row_start[r + 1];
  if (a == b) return;
  const int32_t ka = lower_bound(vals, a, b, u0 * n_slots), kb = lower_bound(vals, ka, b, u1 * n_slots);
  if (ka == kb) return;
  float* dst = r < N ? dkv + r * c : dcmp + (r - N) * c;
  // Pair p of the chunk: its G head-group rows at part + (p - u0 * n_slots) * G * c, adjacent.
  const int64_t p0 = u0 * n_slots, Gc = G * c;
  for (int64_t d0 = 0; d0 < c; d0 += kThreads * kDimsPerThread) {
    float acc[kDimsPerThread];
#pragma unroll
    for (int q = 0; q < kDimsPerThread; ++q) acc[q] = 0.f;
    for (int32_t k0 = ka; k0 < kb; k0 += kBatch) {
      const float* src[kBatch];
#pragma unroll
      for (int x = 0; x < kBatch; ++x) src[x] = k0 + x < kb ? part + (int64_t(vals[k0 + x]) - p0) * Gc : nullptr;
      for (int64_t y = 0; y < G; ++y) {
        float v[kBatch][kDimsPerThread];
#pragma unroll
        for (int x = 0; x < kBatch; ++x)
#pragma unroll
          for (int q = 0; q < kDimsPerThread; ++q) {
            const int64_t d = d0 + threadIdx.x + q * kThreads;
            v[x][q] = src[x] && d < c ? __ldcs(src[x] + y * c + d) : 0.f;
          }
#pragma unroll
        for (int x = 0; x < kBatch; ++x)
          if (src[x]) {
#pragma unroll
            for (int q = 0; q < kDimsPerThread; ++q) acc[q] += v[x][q];
          }
      }
    }
#pragma unroll
    for (int q = 0; q < kDimsPerThread; ++q) {
      const int64_t d = d0 + threadIdx.x + q * kThreads;
      if (d < c) dst[d] += acc[q];
    }
  }
}

int end_bit_for(int64_t max_key) {
  int bits = 1;
  while ((int64_t(1) << bits) <= max_key) ++bits;
  return bits;
}

}  // namespace

int64_t slots_bound(const SparseKeySets& keys, int64_t E, int64_t qb) {
  TREX_CHECK(keys.max_win > 0,
             "sparse attention backward: SparseKeySets.max_win (the most window rows of any query) must be set "
             "(got {})",
             keys.max_win);
  int64_t n = keys.max_win + qb - 1;
  if (keys.cmp_sel) n += qb * keys.k_sel;
  else if (keys.cmp_begin) n += E;
  return n;
}

Plan make_plan(const Units& u, int64_t budget_bytes) {
  TREX_CHECK(u.N > 0 && u.qb > 0 && u.G > 0 && u.n_slots > 0 && u.c > 0,
             "sparse attention backward plan: N {} qb {} G {} slots {} c {}", u.N, u.qb, u.G, u.n_slots, u.c);
  Plan p;
  p.u = u;
  const int64_t U = u.count(), pairs = p.pairs();
  TREX_CHECK(pairs < (int64_t(1) << 31) && u.N + u.E + 1 < (int64_t(1) << 31),
             "sparse attention backward: {} units x {} key slots (or N + E = {}) exceed the int32 inverse index", U,
             u.n_slots, u.N + u.E);
  // Chunk: as many units as the budget holds, in whole multiples of 6 waves of one block per SM (so the chunks'
  // launches end on full waves for 1, 2 or 3 resident blocks per SM) when the budget allows.
  int dev = 0, sms = 1;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t unit_bytes = u.G * u.n_slots * u.c * int64_t(sizeof(float));
  const int64_t fit = std::max<int64_t>(1, budget_bytes / unit_bytes), wave = 6 * int64_t(sms);
  p.chunk_units = std::min(U, fit >= wave ? fit / wave * wave : fit);
  // The kernels address a chunk's partials with 32-bit offsets.
  const int64_t max_units = ((int64_t(1) << 31) - 1) / (unit_bytes / int64_t(sizeof(float)));
  TREX_CHECK(max_units >= 1, "sparse attention backward: one unit's partials ({} bytes) exceed 2^31 floats",
             unit_bytes);
  p.chunk_units = std::min(p.chunk_units, max_units);

  size_t temp = 0;
  cub::DoubleBuffer<int32_t> k2(nullptr, nullptr), v2(nullptr, nullptr);
  TREX_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp, k2, v2, int(pairs), 0, end_bit_for(u.N + u.E)));
  size_t off = 0;
  p.off_sink = off, off = align256(off + size_t(u.N * u.H) * sizeof(float));
  p.off_keys = off, off = align256(off + 2 * size_t(pairs) * sizeof(int32_t));
  p.off_vals = off, off = align256(off + 2 * size_t(pairs) * sizeof(int32_t));
  p.off_rows = off, off = align256(off + size_t(u.N + u.E + 1) * sizeof(int32_t));
  p.off_temp = off, p.temp_bytes = temp, off = align256(off + temp);
  p.off_part = off, off = align256(off + size_t(p.chunk_units * unit_bytes));
  p.bytes = off;
  return p;
}

Index build_index(const Plan& p, const SparseKeySets& keys, void* scratch, cudaStream_t s) {
  unsigned char* base = static_cast<unsigned char*>(scratch);
  const int64_t pairs = p.pairs();
  int32_t* keys0 = reinterpret_cast<int32_t*>(base + p.off_keys);
  int32_t* vals0 = reinterpret_cast<int32_t*>(base + p.off_vals);
  cub::DoubleBuffer<int32_t> k2(keys0, keys0 + pairs), v2(vals0, vals0 + pairs);
  enumerate_kernel<<<unsigned(p.u.count()), kThreads, 0, s>>>(keys, p.u.N, p.u.E, int(p.u.qb), p.u.n_slots,
                                                              k2.Current(), v2.Current());
  TREX_CUDA_LAUNCHED();
  size_t temp = p.temp_bytes;
  TREX_CUDA(cub::DeviceRadixSort::SortPairs(base + p.off_temp, temp, k2, v2, int(pairs), 0,
                                            end_bit_for(p.u.N + p.u.E), s));
  int32_t* rows = reinterpret_cast<int32_t*>(base + p.off_rows);
  const int64_t n_rows = p.u.N + p.u.E;
  row_start_kernel<<<unsigned(std::min<int64_t>((n_rows + kThreads) / kThreads, 4096)), kThreads, 0, s>>>(
      k2.Current(), int32_t(pairs), n_rows, rows);
  TREX_CUDA_LAUNCHED();
  return Index{v2.Current(), rows};
}

void reduce_chunk(const Plan& p, const Index& ix, const float* part, int64_t u0, int64_t u1, float* dkv,
                  float* dcmp, cudaStream_t s) {
  if (u1 <= u0) return;
  // The kv rows the chunk's queries can reach: within n_slots rows before its first query, up to its last.
  const int64_t q0 = u0 * p.u.qb, q1 = std::min(p.u.N, u1 * p.u.qb);
  const int64_t r_lo = std::max<int64_t>(0, q0 - p.u.n_slots), n_kv = q1 - r_lo;
  const int64_t blocks = n_kv + (dcmp ? p.u.E : 0);
  if (blocks == 0) return;
  reduce_kernel<<<unsigned(blocks), kThreads, 0, s>>>(part, ix.vals, ix.row_start, p.u.N, p.u.n_slots, p.u.G,
                                                      p.u.c, u0, u1, r_lo, n_kv, dkv, dcmp);
  TREX_CUDA_LAUNCHED();
}

}  // namespace trex::cuda::dkv_reduce
