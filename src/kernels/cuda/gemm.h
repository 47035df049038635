// Dense GEMMs through cuBLASLt, row-major like the CPU kernels: C[M,N] = alpha * op(A) op(B) + beta * C,
// with A [M,K] (or [K,M] when trans_a), B [K,N] (or [N,K] when trans_b). bf16 operands with fp32
// accumulation (the training path), or fp32 throughout (reference/tests). A handle per stream owns its
// workspace; algorithm choices are cached per shape.
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

 private:
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  struct Plan;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int64_t, bool>, Plan*> plans_;
};

}  // namespace trex::cuda
