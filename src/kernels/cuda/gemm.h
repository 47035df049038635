// Dense GEMMs through cuBLASLt, row-major like the CPU kernels: C[M,N] = alpha * op(A) op(B) + beta * C,
// with A [M,K] (or [K,M] when trans_a), B [K,N] (or [N,K] when trans_b). bf16 operands with fp32
// accumulation (the training path), or fp32 throughout (reference/tests). A handle per stream owns its
// workspace. Algorithm choices are cached per shape class: extents that change from call to call (the rows routed
// to one expert, a decode step's token count) are rounded up to one of four steps per octave for the cache key,
// so cuBLASLt's heuristic runs once per class instead of on every call and the cache stays bounded; the cached
// descriptors are then set to the call's exact extents. Not thread-safe: one Gemm per host thread.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "kernels/cuda/device_buffer.h"

namespace trex::cuda {

enum class GemmType { BF16, F32 };

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  GemmType ab = GemmType::BF16;  // operand type
  GemmType c = GemmType::BF16;   // output type (bf16 or fp32)
  int64_t batch = 1;             // strided batch: A, B, C advance by m*k, k*n, m*n elements
};

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = 64ull << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(const GemmShape& s, const void* a, const void* b, void* c, float alpha = 1.0f, float beta = 0.0f,
           cudaStream_t stream = nullptr);

  // Heuristic queries so far (each is a cache miss); a test hook and a diagnostic.
  int64_t heuristic_calls() const { return heuristic_calls_; }
  // Cached plans (bounded by the number of shape classes, not by the number of distinct extents seen).
  size_t cached_plans() const { return plans_.size(); }

  // The cache key's extent for a dimension that may vary: exact up to 16, else the smallest of
  // {1, 1.25, 1.5, 1.75, 2} x 2^j that holds it.
  static int64_t extent_class(int64_t x);

 private:
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int64_t, bool>;
  Plan* make_plan(const GemmShape& s, int64_t m, int64_t k, bool beta_nonzero);
  std::map<Key, Plan*> plans_;        // by shape class
  std::map<Key, Plan*> exact_plans_;  // the rare exact shape a class's algorithm cannot run
  int64_t heuristic_calls_ = 0;
};

}  // namespace trex::cuda
