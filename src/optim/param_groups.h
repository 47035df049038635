// Which optimiser updates which DeepSeek-V4 parameter (design §5), decided by official tensor name,
// plus the run's freeze list (glob patterns such as "embed.weight" or "layers.*.attn.indexer.*").
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "optim/param.h"

namespace trex::optim {

// AdamW: embed, head, every norm weight, mHC base/scale (hc_*_base, hc_*_scale), attn_sink, compressor ape.
// Buffer: ffn.gate.bias (aux-loss-free router bias) and ffn.gate.tid2eid (hash table).
// Muon: every other tensor with >= 2 dims (projections, experts' w1/w2/w3, mHC fn, router weight).
// Any remaining 1-D tensor goes to AdamW.
ParamGroup dsv4_param_group(std::string_view official_name, const Shape& shape);

// Shell-style glob: '*' matches any run of characters (including '.'), '?' one character.
bool glob_match(std::string_view pattern, std::string_view text);

// Sets group = Frozen for every trainable param whose name matches one of `patterns`. A pattern that
// matches nothing is an error (a typo would otherwise silently train what the user meant to freeze).
void apply_freeze(std::vector<ParamRef>& params, const std::vector<std::string>& patterns);

}  // namespace trex::optim
