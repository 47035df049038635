// The inference engine interface the scheduler drives: a fixed number of sequence slots, each with its own
// caches, and one batched forward step over any subset of slots. The CPU implementation wraps Decoder; a
// CUDA engine can implement the same interface (the scheduler and the HTTP server only see this).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/dsv4/config.h"
#include "model/dsv4/model.h"

namespace trex::infer {

struct EngineFeed {
  int64_t slot = 0;
  const int32_t* ids = nullptr;  // tokens appended to the slot's sequence
  int64_t n = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;  // "cpu", ...
  virtual const dsv4::ModelConfig& config() const = 0;
  virtual int64_t slots() const = 0;
  virtual int64_t max_context() const = 0;
  virtual int64_t slot_length(int64_t slot) const = 0;
  // Empties a slot's caches (a new sequence starts at position 0).
  virtual void reset(int64_t slot) = 0;
  // One step: logits [feeds.size(), vocab] of each feed's last token. Throws trex::Error before changing
  // any slot when a feed is invalid (slot out of range, context overflow, bad token id).
  virtual void forward(const std::vector<EngineFeed>& feeds, std::vector<float>& logits) = 0;
  virtual int64_t cache_bytes() const = 0;  // all slots' caches
};

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<dsv4::Model<float>> model, int64_t slots,
                                        int64_t max_context = 0);

}  // namespace trex::infer
