// Incremental DeepSeek-V4 decoding on the CPU with per-sequence caches (design §2.4-§2.8, §2.10).
//
// A step feeds any number of new tokens to any number of sequences at once (a prompt chunk for one, one
// decoded token for another): every per-token computation (mHC sites, norms, projections, MoE, head) runs
// batched over all new tokens of the step; only the stateful part of attention (window, compressors,
// indexer, core attention) runs per sequence, in token order, against that sequence's cache.
//
// What a sequence caches per layer, and nothing else (the mHC streams are recomputed per token):
//  - the last `window` raw K=V rows (ring buffer, constant size);
//  - CSA / HCA: every compressed entry so far (grows by one per m tokens) plus the partial window not yet
//    compressed (its kv/gate projections, <= m rows); CSA additionally the previous window's "b" series
//    candidates (channels [0, c) of its m rows, design §2.6.2);
//  - CSA: the indexer's compressed keys (one per m tokens) and its own partial / previous-window state.
// So after S tokens a CSA layer holds window + 2*S/m entries-ish and an HCA layer window + S/m', not S.
//
// The decoder reads the model's parameter table in place (no weight copies); the Model must outlive it
// and must not be reloaded while the decoder runs. fp32 throughout.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/dsv4/model.h"

namespace trex::infer {

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

class SequenceCache;  // defined in decoder.cpp

// One sequence's work in a step: append `ids` (at positions length() .. length()+n-1).
struct StepItem {
  SequenceCache* seq = nullptr;
  const int32_t* ids = nullptr;
  int64_t n = 0;
  bool all_logits = false;  // true: logits of every new token; false: of the last one only
};

class Decoder {
 public:
  // max_context: the longest sequence a cache may reach (0 = the config's max_position).
  explicit Decoder(dsv4::Model<float>& model, int64_t max_context = 0);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const dsv4::ModelConfig& config() const { return cfg_; }
  int64_t max_context() const { return max_context_; }
  int64_t vocab() const { return cfg_.vocab_size; }

  std::unique_ptr<SequenceCache> new_sequence() const;

  // Runs one step. logits receives, item after item, [n_i or 1, V] rows (see StepItem::all_logits).
  // Throws trex::Error (before touching any cache) when a sequence would pass max_context or a token id is
  // outside the vocabulary.
  void step(const std::vector<StepItem>& items, std::vector<float>& logits);

  // Convenience: one sequence, one call.
  void step(SequenceCache& seq, const std::vector<int32_t>& ids, std::vector<float>& logits,
            bool all_logits = false);

  struct LayerView;  // what the decoder reads of one layer (defined in decoder.cpp)

 private:
  dsv4::Model<float>& model_;
  dsv4::ModelConfig cfg_;
  int64_t max_context_ = 0;
  std::vector<std::unique_ptr<LayerView>> layers_;
};

// Per-sequence caches. Created by Decoder::new_sequence; independent of every other sequence.
class SequenceCache {
 public:
  ~SequenceCache();
  int64_t length() const { return length_; }  // tokens consumed so far
  std::vector<LayerCacheCounts> counts() const;
  int64_t floats() const;  // total fp32 scalars held over all layers
  size_t bytes() const { return size_t(floats()) * sizeof(float); }

  struct Layer;  // defined in decoder.cpp

 private:
  friend class Decoder;
  SequenceCache() = default;
  int64_t length_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace trex::infer
