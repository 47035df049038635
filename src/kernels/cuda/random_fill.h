// Deterministic pseudo-random device fills (a counter-based hash, uniform in [-scale, scale)) for benchmarks
// and tests that need large non-zero inputs without a host round trip.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

void fill_uniform_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed, float scale, cudaStream_t s = nullptr);
void fill_uniform_f32(float* x, int64_t n, uint64_t seed, float scale, cudaStream_t s = nullptr);

}  // namespace trex::cuda
