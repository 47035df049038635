// Deterministic, resumable shuffling sampler over dataset rows: epoch e visits every row once in a
// permutation drawn from (seed, e); the state (epoch, cursor) is all a checkpoint needs to continue.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace trex::data {

struct SamplerState {
  uint64_t seed = 0;
  int64_t epoch = 0, cursor = 0;
  nlohmann::json to_json() const;
  static SamplerState from_json(const nlohmann::json& j);
  bool operator==(const SamplerState&) const = default;
};

class Sampler {
 public:
  Sampler(int64_t rows, uint64_t seed, bool shuffle = true);
  int64_t next();
  std::vector<int64_t> next_rows(int64_t n);
  const SamplerState& state() const { return st_; }
  void set_state(const SamplerState& s);  // the seed must match (a different seed is a different run)

 private:
  void build_epoch();
  int64_t rows_;
  bool shuffle_;
  SamplerState st_;
  std::vector<int64_t> perm_;
  int64_t perm_epoch_ = -1;
};

// splitmix64: the project's small deterministic RNG step.
uint64_t splitmix64(uint64_t& state);

}  // namespace trex::data
