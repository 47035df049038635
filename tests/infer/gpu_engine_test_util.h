// Helpers shared by the CUDA engine tests: a logits row's error, and the uncached full-sequence logits of the GPU
// training model (the same bf16 weights and kernels as the engine, without caches).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/dsv4/seq_layout.h"
#include "model/cuda/gpu_model.h"

namespace trex::test {

// max |a - ref| / max |ref| over one logits row.
inline double row_err(const std::vector<float>& a, const std::vector<float>& ref) {
  float scale = 0.f, err = 0.f;
  for (size_t v = 0; v < ref.size(); ++v)
    scale = std::max(scale, std::abs(ref[v])), err = std::max(err, std::abs(a[v] - ref[v]));
  return double(err) / std::max(double(scale), 1e-9);
}

// Logits of every position of `seq` from one uncached forward of the GPU training model (head on the host);
// inject: router / indexer choices to use instead of the model's own (null: its own).
inline std::vector<std::vector<float>> uncached_logits(dsv4gpu::GpuModel& full, const std::vector<int32_t>& seq,
                                                       int64_t V, int64_t d,
                                                       const dsv4gpu::Injection* inject = nullptr) {
  const int64_t S = int64_t(seq.size());
  const std::vector<int32_t> labels(seq.size(), -100);
  full.forward(seq.data(), labels.data(), dsv4::SeqLayout::unpacked(1, S), inject);
  const std::vector<float> h = full.final_normed();
  const std::vector<float> head = full.value("head.weight");
  std::vector<std::vector<float>> out(static_cast<size_t>(S), std::vector<float>(static_cast<size_t>(V)));
  for (int64_t t = 0; t < S; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0;
      for (int64_t j = 0; j < d; ++j) acc += double(h[size_t(t * d + j)]) * double(head[size_t(v * d + j)]);
      out[size_t(t)][size_t(v)] = float(acc);
    }
  return out;
}

}  // namespace trex::test
