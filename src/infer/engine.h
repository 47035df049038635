// The inference engine interface the scheduler drives: a fixed number of sequence slots, each with its own
// caches, and one batched forward step over any subset of slots. The CPU implementation wraps Decoder; a
// CUDA engine can implement the same interface (the scheduler and the HTTP server only see this).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
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
  // The same step, returning each feed's greedy token (argmax of its logits, the lowest id on ties, as
  // Sampler at temperature 0) instead of the logits: the CUDA engine picks them on the device and copies back
  // one id per feed. Default: forward + a host argmax.
  virtual void forward_greedy(const std::vector<EngineFeed>& feeds, std::vector<int32_t>& tokens) {
    std::vector<float> logits;
    forward(feeds, logits);
    const int64_t V = config().vocab_size;
    tokens.assign(feeds.size(), 0);
    for (size_t k = 0; k < feeds.size(); ++k) {
      const float* row = logits.data() + int64_t(k) * V;
      int64_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (row[i] > row[best]) best = i;
      tokens[k] = int32_t(best);
    }
  }
  // Makes slot `to` continue exactly where slot `from` is (its caches and length copied; `from` unchanged), so
  // that n sequences sharing a prompt prefill it once (OpenAI `n` > 1). Throws trex::Error for a slot out of
  // range or from == to; engines that cannot copy caches say so.
  virtual void copy_slot(int64_t from, int64_t to) {
    (void)from, (void)to;
    fail("the {} engine cannot copy a slot's caches", name());
  }
  virtual int64_t cache_bytes() const = 0;  // all slots' caches
};

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<dsv4::Model<float>> model, int64_t slots,
                                        int64_t max_context = 0);

// The CUDA engine (src/infer/cuda_engine_cuda.cpp; only in builds with TREX_CUDA, where TREX_HAVE_CUDA is
// defined): bf16 weights on the GPU, copied from `weights` (a CPU parameter table with the official names) or,
// when it is null, random by `seed` (GpuModel::init_random). Its caches are allocated for max_context tokens
// per slot up front (0 = min(config max_position, 16384)).
struct CudaEngineOptions {
  int64_t slots = 8;
  int64_t max_context = 0;
  uint64_t seed = 0;
  bool moe_grouped_gemm = false;  // GpuModelOptions::moe_grouped_gemm (no host read of the expert counts)
  // The reference paths the fast ones are tested against: the per-warp decode attention kernel instead of the
  // tensor-core one (head dims 256 / 512 only), and one cuBLASLt GEMM per routed expert (after a host read of the
  // expert counts per layer) instead of the grouped GEMM.
  bool reference_attention = false;
  bool per_expert_moe = false;
  bool profile = false;  // per-phase CUDA-event times of every step, printed to stderr when the engine is destroyed
};
std::unique_ptr<Engine> make_cuda_engine(const dsv4::ModelConfig& cfg, const dsv4::ParamTable<float>* weights,
                                         const CudaEngineOptions& opts);

}  // namespace trex::infer
