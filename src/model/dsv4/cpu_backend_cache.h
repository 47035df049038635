// The CPU backend's per-sequence decode caches and the attention sub-layer against them (design §2.4-§2.8), fp32.
//
// What a sequence caches per layer, and nothing else (the mHC streams are recomputed per token):
//  - the last `window` raw K=V rows (ring buffer, constant size);
//  - CSA / HCA: every compressed entry so far (grows by one per m tokens) plus the partial window not yet
//    compressed (its kv/gate projections, <= m rows); CSA additionally the previous window's "b" series
//    candidates (channels [0, c) of its m rows, design §2.6.2);
//  - CSA: the indexer's compressed keys (one per m tokens) and its own partial / previous-window state.
// So after S tokens a CSA layer holds window + 2*S/m entries-ish and an HCA layer window + S/m', not S.
// Every type here is a plain value: copying a CpuSequenceCaches forks the sequence.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "model/dsv4/attention.h"
#include "model/dsv4/backend.h"

namespace trex::dsv4 {

// Entry counts of one sequence's cache in one layer (for memory accounting and tests).
struct LayerCacheCounts {
  int64_t window_rows = 0;   // raw K=V rows held (<= window)
  int64_t compressed = 0;    // compressed entries (CSA / HCA)
  int64_t partial_rows = 0;  // tokens of the current window not yet compressed (< m)
  int64_t prev_rows = 0;     // CSA: rows of the previous window's "b" series kept (0 or m)
  int64_t index_keys = 0;    // CSA: indexer keys
  int64_t index_partial_rows = 0;
  int64_t floats = 0;  // total fp32 scalars held by this layer's cache
};

// Streaming compressor state (design §2.6): the rows of the window being filled and, for the overlapped CSA
// compressor, the previous window's "b" series; emits one entry per completed window.
struct CompressorStream {
  int64_t m = 0, c = 0, rope_dim = 0;
  bool overlap = false;
  double eps = 1e-6;
  const float* norm_w = nullptr;          // [c] the compressor's norm weight (the model's parameter)
  std::vector<float> part_kv, part_gate;  // [m, width*c]; gate already includes ape[offset]
  int64_t n_part = 0;
  std::vector<float> prev_kv, prev_gate;  // [m, c]: channels [0, c) of the previous window's rows
  bool has_prev = false;
  std::vector<float> entries;  // [E, c] normed, RoPE applied
  int64_t n_entries = 0;

  CompressorStream(int64_t m, int64_t c, int64_t rope_dim, bool overlap, double eps, const float* norm_w);
  int64_t width() const { return overlap ? 2 : 1; }
  int64_t floats() const;
  // Consumes the projections of the token at `pos` (kv, gate rows of width*c); ape [m, width*c].
  void push(const float* kv, const float* gate, const float* ape, int64_t pos, const std::vector<float>& inv_freq);

 private:
  void emit(int64_t first_pos, const std::vector<float>& inv_freq);
  void norm_and_rope(const float* pooled, int64_t pos, const std::vector<float>& inv_freq, float* y) const;
};

struct LayerCache {
  int64_t W = 0, c = 0;
  std::vector<float> ring;  // [W, c]: the K=V row of position p lives in slot p % W
  int64_t n_win = 0;
  std::optional<CompressorStream> cmp;  // CSA / HCA
  std::optional<CompressorStream> idx;  // CSA: the indexer's keys
  LayerCacheCounts counts() const;
};

struct CpuSequenceCaches final : SequenceCaches {
  std::vector<LayerCache> layers;  // one per main layer
};

// Empty caches of one layer (parameters: the compressor norms the entries are normed with).
LayerCache new_layer_cache(const AttentionDims& dims, const AttentionParamsT<float>& p);

// The attention sub-layer of one layer over a decode step's new tokens: a [n_tok, d] (the attn_norm output) ->
// out [n_tok, d]. caches[i] is the layer's cache of the step's sequence i; they take the new tokens.
void cached_attention_fwd(const AttentionDims& dims, const AttentionParamsT<float>& p,
                          const std::vector<float>& inv_freq, const CachedTokens& tokens, int64_t n_tok,
                          const std::vector<LayerCache*>& caches, const float* a, float* out);

}  // namespace trex::dsv4
