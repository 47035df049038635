// The CUDA backend's decode caches (design §2.4-§2.8): every slot's per-layer caches of a model, allocated up front
// for max_context tokens per slot, and one decode pass's plan on the device. Internal to model/cuda and the CUDA
// serving engine (src/infer/cuda_engine_cuda.cpp), which hands the slots to the block program as SequenceCaches.
//
// What a slot caches per layer, and nothing else (the mHC streams are recomputed per token): the last `window` raw
// K=V rows (a ring), the compressed CSA / HCA entries and the CSA indexer keys (S/m each), and the compressor rows
// not yet pooled (m, or 2m when overlapped). A layer's compressed entries and window rings share one allocation, so
// that the tensor-core attention reaches both through one key array (decode_key_sets). Stale contents are never
// read: a step reads only rows and entries below the slot's length.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kernels/cuda/decode_attention.h"
#include "model/cuda/gpu_internal.h"
#include "model/dsv4/backend.h"

namespace trex::dsv4gpu {

// One layer's caches of all slots (contiguous per slot: slot s owns rows [s * per_slot, (s + 1) * per_slot)).
struct DecodeLayerCache {
  dsv4::AttentionDims dims;
  DevMem keys;          // [slots * cap + slots * W, c]: the compressed entries, then the window rings
  bf16* cmp = nullptr;  // [slots, cap, c] compressed entries (CSA / HCA; start of keys)
  bf16* win = nullptr;  // [slots, W, c] window rings (keys + slots * cap rows)
  DevMem ckv, cgate;    // [slots, rows, w*c] compressor rows not yet pooled (and, CSA, the previous window's)
  DevMem ikeys;         // CSA: [slots, cap, c_I] indexer keys
  DevMem ikv, igate;    // CSA: [slots, 2m, 2 c_I]
  int64_t cap = 0, rows = 0;
};

class DecodeCaches {
 public:
  // dims: the attention of each layer the backend runs (a stage's blocks in order).
  DecodeCaches(const std::vector<dsv4::AttentionDims>& dims, int64_t slots, int64_t max_context);
  int64_t slots() const { return slots_; }
  int64_t max_context() const { return max_context_; }
  DecodeLayerCache& layer(int64_t l) { return layers_[size_t(l)]; }
  int64_t n_layers() const { return int64_t(layers_.size()); }
  // Slot `to` continues where `from` is after `length` tokens: device copies of from's regions (the entries
  // written so far, the whole window ring and partial-window rows), stream-ordered before the next step.
  void copy_slot(int64_t from, int64_t to, int64_t length);
  // Bytes of cache state a slot of `length` tokens uses (the arrays are allocated for max_context up front).
  int64_t bytes(int64_t length) const;

 private:
  int64_t slots_ = 0, max_context_ = 0;
  std::vector<DecodeLayerCache> layers_;
};

// A slot of a DecodeCaches, as the block program's per-sequence caches (CachedTokens::caches).
struct DecodeSlot final : dsv4::SequenceCaches {
  const DecodeCaches* owner = nullptr;
  int64_t slot = 0;
};

// One decode pass on the device: its token plan (cuda::DecodeStep), the entries it completes per compress ratio,
// the layout the MoE reads (N and the token ids, for hash routing), and the activations every block reuses (the
// stream X, the mid stream, one sub-layer input / output, both sites' mixing rows). All in `mem`, freed
// stream-ordered when the next pass starts.
struct DecodePass {
  Pool mem;
  cuda::DecodeStep st;
  const int32_t* pos = nullptr;  // [N] device: the tokens' positions
  std::vector<int32_t> first;    // [I] host: each item's length before the step
  struct Entries {
    const int32_t *item = nullptr, *idx = nullptr;  // device: entry idx[k] of item item[k] completes this step
    int64_t n = 0;
    int64_t max_visible = 0;  // the largest (pos + 1) / m of the step's tokens
  };
  std::map<int64_t, Entries> entries;  // by compress ratio
  std::map<int64_t, const int64_t*> csa_sel;  // by block: the indexer's selection [N, index_topk] (block's picks)
  DevLayout lay;
  bf16 *X = nullptr, *Xmid = nullptr, *an = nullptr, *y = nullptr;
  float* rstd = nullptr;
  cuda::MhcActs sa{}, sf{};
};

}  // namespace trex::dsv4gpu
