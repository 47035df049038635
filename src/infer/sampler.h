// Next-token sampling: greedy (temperature 0), or temperature + nucleus (top-p) sampling with a seeded,
// platform-independent generator (splitmix64; the draw uses 53 random bits), so a given seed yields the
// same completion on every machine. top_p -> 0 keeps only the most likely token (= greedy).
#pragma once
#include <cstdint>

namespace trex::infer {

// The smallest non-zero temperature: below it 1/T overflows the logit scale (1e-310 is a denormal whose
// inverse is inf) and "sampling" silently degenerates; 0 asks for greedy decoding explicitly.
constexpr double kMinTemperature = 1e-3;

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
};

// Index of the largest logit (the lowest index among exact ties).
int32_t argmax(const float* logits, int64_t n);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  const SamplingParams& params() const { return p_; }
  int32_t sample(const float* logits, int64_t n);
  double uniform();  // [0, 1)

 private:
  SamplingParams p_;
  uint64_t state_;
};

// Throws trex::Error naming the field when temperature is neither 0 nor in [kMinTemperature, 100], or top_p
// is outside (0, 1].
void validate(const SamplingParams& p);

}  // namespace trex::infer
