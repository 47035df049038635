// `trex bench ops`: times the CUDA kernels of src/kernels/cuda at a model config's shapes.
#pragma once
#include <cstdint>
#include <string>

namespace trex::bench {

void bench_ops(const std::string& config, int64_t tokens, int reps);

}  // namespace trex::bench
