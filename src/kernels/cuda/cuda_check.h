// Error checking for CUDA runtime and cuBLAS(Lt) calls: every failure becomes a trex::Error naming the
// call, the file and line, and the library's message. Checked after every launch too (TREX_CUDA_LAUNCHED).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define TREX_CUDA(call)                                                                                      \
  do {                                                                                                       \
    cudaError_t err_ = (call);                                                                               \
    if (err_ != cudaSuccess)                                                                                 \
      ::trex::fail("CUDA error {} ({}) in {} at {}:{}", int(err_), cudaGetErrorString(err_), #call, __FILE__, \
                   __LINE__);                                                                                \
  } while (0)

#define TREX_CUBLAS(call)                                                                                        \
  do {                                                                                                           \
    cublasStatus_t st_ = (call);                                                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                            \
      ::trex::fail("cuBLAS error {} ({}) in {} at {}:{}", int(st_), cublasLtGetStatusString(st_), #call, __FILE__, \
                   __LINE__);                                                                                    \
  } while (0)

#define TREX_CUDA_LAUNCHED() TREX_CUDA(cudaGetLastError())
