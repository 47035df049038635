#include "data/sampler.h"

#include "core/error.h"

namespace trex::data {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

nlohmann::json SamplerState::to_json() const {
  return {{"seed", seed}, {"epoch", epoch}, {"cursor", cursor}};
}
SamplerState SamplerState::from_json(const nlohmann::json& j) {
  SamplerState s;
  s.seed = j.at("seed").get<uint64_t>();
  s.epoch = j.at("epoch").get<int64_t>();
  s.cursor = j.at("cursor").get<int64_t>();
  return s;
}

Sampler::Sampler(int64_t rows, uint64_t seed, bool shuffle) : rows_(rows), shuffle_(shuffle) {
  TREX_CHECK(rows > 0, "sampler over an empty dataset");
  st_.seed = seed;
}

void Sampler::build_epoch() {
  perm_.resize(size_t(rows_));
  for (int64_t i = 0; i < rows_; ++i) perm_[size_t(i)] = i;
  if (shuffle_) {
    uint64_t s = st_.seed ^ (0xD1B54A32D192ED03ull * uint64_t(st_.epoch + 1));
    for (int64_t i = rows_ - 1; i > 0; --i) {
      int64_t j = int64_t(splitmix64(s) % uint64_t(i + 1));
      std::swap(perm_[size_t(i)], perm_[size_t(j)]);
    }
  }
  perm_epoch_ = st_.epoch;
}

int64_t Sampler::next() {
  if (st_.cursor >= rows_) st_.epoch++, st_.cursor = 0;
  if (perm_epoch_ != st_.epoch) build_epoch();
  return perm_[size_t(st_.cursor++)];
}

std::vector<int64_t> Sampler::next_rows(int64_t n) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < n; ++i) r.push_back(next());
  return r;
}

void Sampler::set_state(const SamplerState& s) {
  TREX_CHECK(s.seed == st_.seed, "sampler state has seed {} but this run uses seed {}", s.seed, st_.seed);
  TREX_CHECK(s.cursor >= 0 && s.cursor <= rows_ && s.epoch >= 0, "sampler state out of range (cursor {} of {} rows)",
             s.cursor, rows_);
  st_ = s;
}

}  // namespace trex::data
