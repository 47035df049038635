// Incremental DeepSeek-V4 decoding on the CPU with per-sequence caches (design §2.4-§2.8, §2.10): the block
// program (model/dsv4/program.h) run as a decode step over the CPU backend.
//
// A step feeds any number of new tokens to any number of sequences at once (a prompt chunk for one, one
// decoded token for another): every per-token computation (mHC sites, norms, projections, MoE, head) runs
// batched over all new tokens of the step; only the stateful part of attention (window, compressors,
// indexer, core attention) runs per sequence, in token order, against that sequence's cache. What a sequence
// caches per layer: model/dsv4/cpu_backend_cache.h.
//
// The decoder reads the model's parameter table in place (no weight copies); the Model must outlive it
// and must not be reloaded while the decoder runs. fp32 throughout.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/dsv4/cpu_backend.h"
#include "model/dsv4/cpu_backend_cache.h"
#include "model/dsv4/model.h"
#include "model/dsv4/program.h"

namespace trex::infer {

using LayerCacheCounts = dsv4::LayerCacheCounts;  // entry counts of one sequence's cache in one layer

class SequenceCache;

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

 private:
  dsv4::ModelConfig cfg_;
  int64_t max_context_ = 0;
  std::unique_ptr<dsv4::CpuBackend<float>> backend_;  // this decoder's step buffers over the model's parameters
  std::unique_ptr<dsv4::BlockProgram> program_;
};

// Per-sequence caches. Created by Decoder::new_sequence; independent of every other sequence.
class SequenceCache {
 public:
  ~SequenceCache();
  int64_t length() const { return length_; }  // tokens consumed so far
  std::vector<LayerCacheCounts> counts() const;
  int64_t floats() const;  // total fp32 scalars held over all layers
  size_t bytes() const { return size_t(floats()) * sizeof(float); }
  // An independent copy of this sequence's caches (sequences that share a prompt: prefill once, then fork).
  std::unique_ptr<SequenceCache> clone() const;

 private:
  friend class Decoder;
  SequenceCache() = default;
  int64_t length_ = 0;
  dsv4::CpuSequenceCaches caches_;
};

}  // namespace trex::infer
