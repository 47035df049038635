// The stateful part of DeepSeek-V4 attention for incremental decoding on the GPU (design §2.4-§2.7): one step feeds
// any number of new tokens to any number of sequences ("items"), each sequence owning a cache slot. Mirrors the CPU
// decoder (src/infer/decoder.cpp): per layer and slot the cache holds the last `window` raw K=V rows (ring: the row
// of position p lives at p % W), the compressed entries so far, and the compressor's rows not yet pooled (ring of
// R = m rows, or 2m when overlapped so the previous window's "b" series is still there). A compressed entry is a
// pure function of the rows of its window(s), so nothing else is stored: the sequence length says which rows and
// entries exist.
//
// Step order per layer (stream-ordered): compress_entries (reads this step's projections and the row ring) ->
// store_rows into the row ring; indexer / attention (reads the step's kv and the window ring) -> store_rows into
// the window ring. bf16 storage, fp32 math.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// What every decode kernel knows of a step (device pointers, int32).
struct DecodeStep {
  int64_t n_tok = 0, n_items = 0;
  const int32_t* tok_pos = nullptr;     // [N] absolute position of each new token
  const int32_t* tok_item = nullptr;    // [N] its item
  const int32_t* item_slot = nullptr;   // [I] cache slot of each item
  const int32_t* item_first = nullptr;  // [I] the sequence's length before the step (= first new position)
  const int32_t* item_begin = nullptr;  // [I + 1] first new token of each item in the step's rows
};

// Entries completed by this step: entry `entry_idx[k]` of item `entry_item[k]` (its window ends inside the step).
struct DecodeCompress {
  int64_t n_entries = 0;              // entries to build this step
  const int32_t* entry_item = nullptr;
  const int32_t* entry_idx = nullptr;
  int64_t ratio = 0, c = 0;           // m, entry width
  bool overlap = false;               // rows are 2c wide: channels [0, c) the "b" series, [c, 2c) the own series
  int64_t rows = 0;                   // R of the row ring (m, or 2m when overlapped)
  const bf16* step_kv = nullptr;      // [N, w*c] this step's projections
  const bf16* step_gate = nullptr;
  const bf16* ring_kv = nullptr;      // [slots, R, w*c] rows of earlier steps
  const bf16* ring_gate = nullptr;
  const float* ape = nullptr;         // [m, w*c]
  const bf16* norm = nullptr;         // [c] weighted RMSNorm after pooling
  float eps = 1e-6f;
  int64_t rope_dim = 0;
  const float* cos = nullptr;         // [n_pos, rope_dim/2] (RoPE at the window's first position)
  const float* sin = nullptr;
  int64_t cap = 0;                    // entries per slot in `entries`
  bf16* entries = nullptr;            // [slots, cap, c] written at [slot, entry_idx]
};
void decode_compress_entries(const DecodeStep& st, const DecodeCompress& a, cudaStream_t s = nullptr);

// Copies the step's rows src [N, width] into ring [slots, R, width] at position % R, keeping only the last R
// positions of each sequence (older rows of the step would be overwritten anyway).
void decode_store_rows(const DecodeStep& st, bf16* ring, const bf16* src, int64_t rows, int64_t width,
                       cudaStream_t s = nullptr);

// Indexer visibility of each new token as global entry ranges of a [slots, cap] entry array:
// [slot * cap, slot * cap + (pos + 1) / m).
void decode_visible_ranges(const DecodeStep& st, int64_t ratio, int64_t cap, int64_t* vis_begin, int64_t* vis_end,
                           cudaStream_t s = nullptr);

struct DecodeAttention {
  int64_t heads = 0, c = 0;    // c = 256 or 512
  float scale = 1.f;           // 1/sqrt(c)
  const bf16* q = nullptr;     // [N, H, c] (RoPE applied)
  const bf16* kv = nullptr;    // [N, c] this step's K=V rows
  const bf16* win = nullptr;   // [slots, W, c] window ring (before this step's rows are stored)
  int64_t window = 0;
  const bf16* cmp = nullptr;   // [slots * cap, c] compressed entries (null: sliding layer)
  int64_t cap = 0, ratio = 0;  // HCA: token at pos sees entries [0, (pos + 1) / ratio) of its slot
  const int64_t* sel = nullptr;  // CSA: [N, k_sel] global entry indices (-1 = empty); overrides the range
  int64_t k_sel = 0;
  const float* sink = nullptr;  // [H]
  bf16* o = nullptr;            // [N, H, c]
  int keys_per_iter = 4;        // keys a warp visits at once (1 or 4: the same math, 4 overlaps their latencies)
};
// Softmax attention with a per-head sink over window rows + compressed entries (K = V).
void decode_attention(const DecodeStep& st, const DecodeAttention& a, cudaStream_t s = nullptr);

// The key sets of a step's queries for the training tensor-core attention (attention_sparse.h,
// sparse_attention_fwd), so that prefill chunks and decoded tokens both run on it: its keys of query i are the kv
// rows [win_begin[i], i] plus selected rows of one second array `cmp`. The step's own kv rows [N, c] are the kv
// array: the in-step part of a token's window (rows of its item from max(first, pos - W + 1) on) is contiguous
// there. Everything older goes through the selection, indices into one combined per-layer key array
// [slots * cap compressed entries | slots * W window ring rows] (ring row of position t of slot s at
// ring_base + s * W + t % W): columns [0, n_hist) the item's ring rows of positions first - n_hist .. first - 1
// (-1 when outside the token's window or before the sequence start), then n_cmp compressed columns: CSA the
// indexer's selection (best first, -1 trailing, so its first n_cmp columns hold every valid one when n_cmp >=
// the visible count), HCA the entries [0, (pos + 1) / ratio) of the slot. Same keys as decode_attention, in
// another order (softmax is order-free up to rounding).
struct DecodeKeySets {
  int64_t window = 0;             // W
  int64_t ring_base = 0;          // first ring row in the combined array (slots * cap)
  int64_t n_hist = 0;             // history columns: max over the step's items of min(first, W - 1)
  int64_t n_cmp = 0;              // compressed columns (0: sliding layer)
  int64_t cap = 0, ratio = 0;     // HCA range (used when sel is null and n_cmp > 0)
  const int64_t* sel = nullptr;   // CSA: [N, k_sel] indexer selection, global entry indices (n_cmp <= k_sel)
  int64_t k_sel = 0;
  int64_t* win_begin = nullptr;   // out [N]
  int64_t* cols = nullptr;        // out [N, n_hist + n_cmp] (may be null when that is 0)
};
void decode_key_sets(const DecodeStep& st, const DecodeKeySets& a, cudaStream_t s = nullptr);

// Rows of the last token of every item: out [I, width] = x[item_begin[i + 1] - 1].
void decode_last_rows(const DecodeStep& st, const bf16* x, int64_t width, bf16* out, cudaStream_t s = nullptr);

// Greedy pick of every row: out[r] = argmax of logits[r, 0:V) (the lowest index on ties, as the host Sampler).
void decode_argmax_rows(const float* logits, int64_t rows, int64_t V, int32_t* out, cudaStream_t s = nullptr);

}  // namespace trex::cuda
