// Activation recomputation policy of a training model (GPU model: GpuModelOptions::recompute; `recompute:` in a
// training config). none: every block keeps its forward's activations until its backward. selective: the cheap,
// large results (normed sub-layer inputs, the stream between a block's two sites, the attention's normed / rotated
// queries and keys and its rotated output) are dropped after the forward and recomputed from what is kept (the
// projections' outputs) right before the block's backward. full: a block keeps only its input stream (and its
// router / indexer selections, so the replay cannot flip a near-tie); its forward re-runs right before its
// backward.
#pragma once
#include <cstdint>
#include <string>

namespace trex::dsv4 {

enum class Recompute { None, Selective, Full };

const char* to_string(Recompute r);
// none | selective | full; anything else is an error naming `what` (the option or config key) and the value.
Recompute parse_recompute(const std::string& s, const std::string& what);

// The policy of one block under `mode` with `full_layers` (recompute_full_layers): under full, only main layers
// [0, full_layers) replay their forward in full and the later ones (the MTP block, layer n_layers, among them)
// recompute selectively, trading memory for the replay's time layer by layer (Megatron's "block" method, with the
// rest selective instead of none). full_layers < 0: every layer in full; ignored under none and selective.
inline Recompute recompute_of_layer(Recompute mode, int64_t full_layers, int64_t layer) {
  return mode == Recompute::Full && full_layers >= 0 && layer >= full_layers ? Recompute::Selective : mode;
}

}  // namespace trex::dsv4
