// Activation recomputation policy of a training model (GPU model: GpuModelOptions::recompute; `recompute:` in a
// training config). none: every block keeps its forward's activations until its backward. selective: the cheap,
// large results (normed sub-layer inputs, the stream between a block's two sites, the attention's normed / rotated
// queries and keys and its rotated output) are dropped after the forward and recomputed from what is kept (the
// projections' outputs) right before the block's backward. full: a block keeps only its input stream (and its
// router / indexer selections, so the replay cannot flip a near-tie); its forward re-runs right before its
// backward.
#pragma once
#include <string>

namespace trex::dsv4 {

enum class Recompute { None, Selective, Full };

const char* to_string(Recompute r);
// none | selective | full; anything else is an error naming `what` (the option or config key) and the value.
Recompute parse_recompute(const std::string& s, const std::string& what);

}  // namespace trex::dsv4
