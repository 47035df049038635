// Speculative decoding with the checkpoint's MTP module (design §2.10): after every step the MTP block, fed the
// main model's last final streams and the token just picked, drafts the token after it; the next step feeds the
// picked token and the draft together (2 tokens for that sequence) and the main model's greedy choice at the
// picked token's position verifies the draft. Accepted: the step returns two tokens (the draft and the main
// model's choice after it). Rejected: one token, and the draft's position is not counted (the caches keep the
// rows of position p at p mod R and build compressed entries from rows below the sequence length only, so the
// rejected row is overwritten by the next step before anything reads it: the caches stay as plain decoding leaves
// them). Greedy requests only: a sampled step runs plain (forward), so sampling never speculates.
// Engines that can do this implement SpeculativeEngine besides Engine (the CUDA engine with the MTP loaded).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "infer/engine.h"

namespace trex::infer {

struct SpeculativeStats {
  int64_t verify_steps = 0;  // steps that verified at least one draft
  int64_t drafted = 0;       // drafts verified (one per sequence and step)
  int64_t accepted = 0;      // drafts equal to the main model's greedy choice
  double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
};

class SpeculativeEngine {
 public:
  virtual ~SpeculativeEngine() = default;
  virtual bool speculating() const = 0;  // false: forward_greedy_speculative returns one token per feed
  // forward_greedy with the drafts verified: tokens[k] holds 1 or 2 tokens for feed k, the greedy continuation
  // of the slot's sequence. The slot's length grows by feed k's n plus (tokens[k].size() - 1); the last returned
  // token is not in the cache yet (the caller feeds it next, as with forward_greedy). decoding[k] (size of feeds)
  // says feed k is that token (a decode step, not a prompt chunk): only then is the slot's draft verified (and
  // only when the token is the one the engine returned last for the slot).
  virtual void forward_greedy_speculative(const std::vector<EngineFeed>& feeds, const std::vector<char>& decoding,
                                          std::vector<std::vector<int32_t>>& tokens) = 0;
  virtual SpeculativeStats speculative_stats() const = 0;
};

// The engine's speculative interface, or null when it has none.
inline SpeculativeEngine* speculative_engine(Engine& e) { return dynamic_cast<SpeculativeEngine*>(&e); }

// The CUDA engine (engine.h) with speculation on when speculative_mtp: the config must have the MTP layer and
// `weights` (when not null, i.e. random) its mtp.0.* tensors; off, the MTP module is not loaded.
std::unique_ptr<Engine> make_cuda_engine(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                         const CudaEngineOptions& opts, bool speculative_mtp);

}  // namespace trex::infer
