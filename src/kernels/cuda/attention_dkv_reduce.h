// The deterministic dK + dV of the sparse attention backward (attention_sparse.h, attention_generic.h). Every
// backward kernel serves "units" (one query, or a multi-query block's qb consecutive queries over the union of their
// key lists) in G blocks per unit (head groups). Instead of adding each block's dK + dV rows to dkv / dcmp with fp32
// atomics (whose order, and so whose rounding, changes from run to run), a block writes the row of each of its key
// slots to a partial buffer; then, per destination row, the partials are summed in a fixed order (unit, then head
// group) and added to the row once. The order comes from an inverse index built per backward call: the (unit, slot)
// pairs sorted stably by destination row (cub radix sort; the pairs enter in increasing order, so each row's list
// stays increasing). The partials of all units can be large (CSA at N = 8192: 640 slots x 2 KiB per query), so the
// units run in chunks whose partials fit a fixed budget, each chunk reduced before the next one starts; the chunk
// size is a function of the shapes and the device's SM count only (never of free memory), so a given shape on a
// given GPU always sums in the same order. Internal to the attention kernels, their tests and dev/attention.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_sparse.h"

namespace trex::cuda::dkv_reduce {

// Where a backward kernel puts the dK + dV row of key slot j of its block: part + ((blockIdx.x * n_slots + j) *
// gridDim.y + blockIdx.y) * c, for the units u0 .. u0 + gridDim.x - 1 (the launch's chunk; a pair's G head-group
// rows are adjacent, so the reduction finds them without dividing). part null: the kernel adds the rows to dkv /
// dcmp with fp32 atomics instead (the atomic versions kept in dev/attention).
struct PartOut {
  float* part = nullptr;
  int64_t u0 = 0;       // first unit of the launch: the block's unit is u0 + blockIdx.x
  int64_t n_slots = 0;  // key slots per unit
};
// (A chunk's partials stay below 2^31 floats, so the kernels may address them with 32-bit offsets.)

// The contributors of one backward call: U = ceil(N / qb) units of qb queries, G blocks per unit, at most n_slots
// keys per unit, c dims per row.
struct Units {
  int64_t N = 0, E = 0, H = 0, c = 0;
  int64_t qb = 1, G = 1, n_slots = 0;
  int64_t count() const { return (N + qb - 1) / qb; }
};

// The most keys a unit of qb queries can hold: window rows max_win + qb - 1, then the compressed slots (CSA: qb
// selection rows; HCA: a range of the E entries). Refuses key sets without max_win.
int64_t slots_bound(const SparseKeySets& keys, int64_t E, int64_t qb);

// Scratch layout of one backward call (offsets in bytes from the scratch base, 256-byte aligned).
struct Plan {
  Units u;
  int64_t chunk_units = 0;  // units per launch
  size_t off_sink = 0;      // [N, H] fp32 sink partials (the caller's fixed-order dsink reduction)
  size_t off_keys = 0, off_vals = 0;  // 2 x [pairs] int32 each (radix sort double buffers)
  size_t off_rows = 0;                // [N + E + 1] int32: first sorted pair of each destination row
  size_t off_temp = 0, temp_bytes = 0;
  size_t off_part = 0;  // [chunk_units, n_slots, G, c] fp32
  size_t bytes = 0;     // the whole scratch
  int64_t pairs() const { return u.count() * u.n_slots; }
};
// budget_bytes: the partials one chunk may hold (at least one unit's).
Plan make_plan(const Units& u, int64_t budget_bytes = kSparseAttnPartialBudget);

// The inverse index of a plan, built in the scratch by build_index.
struct Index {
  const int32_t* vals = nullptr;       // pair ids (unit * n_slots + slot) sorted by destination row, then id
  const int32_t* row_start = nullptr;  // [N + E + 1]
};
Index build_index(const Plan& p, const SparseKeySets& keys, void* scratch, cudaStream_t s);

inline float* sink_part(const Plan& p, void* scratch) {
  return reinterpret_cast<float*>(static_cast<unsigned char*>(scratch) + p.off_sink);
}
inline float* partials(const Plan& p, void* scratch) {
  return reinterpret_cast<float*>(static_cast<unsigned char*>(scratch) + p.off_part);
}

// dkv [N, c] / dcmp [E, c] rows += the partials of units [u0, u1), summed in a fixed order: the row's pairs in
// increasing (unit, slot) order, in batches of 8 pairs, each batch head group by head group.
void reduce_chunk(const Plan& p, const Index& ix, const float* part, int64_t u0, int64_t u1, float* dkv,
                  float* dcmp, cudaStream_t s);

// The whole deterministic accumulation: the index, then per chunk launch(PartOut, n_units) (the backward kernel
// over units [po.u0, po.u0 + n_units)) and its reduction.
template <class Launch>
void run(const Plan& p, const SparseKeySets& keys, void* scratch, float* dkv, float* dcmp, cudaStream_t s,
         Launch&& launch) {
  const Index ix = build_index(p, keys, scratch, s);
  const int64_t U = p.u.count();
  for (int64_t u0 = 0; u0 < U; u0 += p.chunk_units) {
    const int64_t u1 = u0 + p.chunk_units < U ? u0 + p.chunk_units : U;
    launch(PartOut{partials(p, scratch), u0, p.u.n_slots}, u1 - u0);
    reduce_chunk(p, ix, partials(p, scratch), u0, u1, dkv, dcmp, s);
  }
}

}  // namespace trex::cuda::dkv_reduce
