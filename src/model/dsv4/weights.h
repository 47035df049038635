// The parameter table of a DeepSeek-V4 model: every trainable tensor by its OFFICIAL name (design §3) with its
// shape and a slice of ONE parameter arena, and the same slice of a parallel gradient arena. Non-trainable
// buffers (router bias fp32, tid2eid int32) live beside it, keyed by official name as well.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace trex::dsv4 {

struct ParamInfo {
  std::string name;  // official key, e.g. "layers.0.attn.wq_a.weight"
  Shape shape;
  int64_t offset = 0;    // in scalars, into the arenas
  int64_t numel = 0;
  bool lm_grad = true;   // false: the LM loss gives it no gradient (the indexer's tensors)
};

template <class T>
class ParamTable {
 public:
  // Declares a tensor (before allocate()); names must be unique.
  void declare(const std::string& name, const Shape& shape, bool lm_grad = true);
  // Allocates the value and gradient arenas (zeroed), 64-byte aligned slices.
  void allocate();
  bool allocated() const { return values_.size() > 0; }

  const std::vector<ParamInfo>& entries() const { return entries_; }
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  const ParamInfo& info(const std::string& name) const;
  T* value(const std::string& name) { return arena_value(info(name)); }
  T* grad(const std::string& name) { return arena_grad(info(name)); }
  T* arena_value(const ParamInfo& p) { return values_.data() + p.offset; }
  T* arena_grad(const ParamInfo& p) { return grads_.data() + p.offset; }
  const T* arena_value(const ParamInfo& p) const { return values_.data() + p.offset; }
  const T* arena_grad(const ParamInfo& p) const { return grads_.data() + p.offset; }
  int64_t n_scalars() const { return total_; }
  int64_t n_params() const;  // sum of numel (without padding)
  void zero_grads();

  // Non-trainable buffers.
  std::map<std::string, std::vector<float>> bias;       // "layers.N.ffn.gate.bias" -> [E]
  std::map<std::string, std::vector<int32_t>> tid2eid;  // "layers.N.ffn.gate.tid2eid" -> [V*K]

 private:
  std::vector<ParamInfo> entries_;
  std::map<std::string, size_t> index_;
  int64_t total_ = 0;
  std::vector<T> values_, grads_;
};

}  // namespace trex::dsv4
