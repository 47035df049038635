// Memory-bound pieces of the MTP input's training step (design §2.10; the model's dataflow is
// model/cuda/gpu_mtp_cuda.cpp): the embedding rows of the next tokens with "no next token" rows, and the sum of a
// stream gradient over the n_hc streams (the broadcast e's backward).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// out [n, d] (written) = table[ids[t]], zero where ids[t] < 0 (ids checked on the host by the caller).
void embed_rows_masked_fwd(bf16* out, const int32_t* ids, const bf16* table, int64_t n, int64_t d,
                           cudaStream_t s = nullptr);
// dtable [V, d] += drows [n, d] for the rows with ids[t] >= 0; each table row sums its tokens in token order
// (deterministic, no atomics).
void embed_rows_masked_bwd(float* dtable, const int32_t* ids, const bf16* drows, int64_t n, int64_t d,
                           cudaStream_t s = nullptr);
// out [n, d] bf16 (written) = sum over j of dX [n, n_hc, d] fp32 (summed in fp32, rounded once).
void sum_streams_f32_to_bf16(bf16* out, const float* dX, int64_t n, int64_t n_hc, int64_t d,
                             cudaStream_t s = nullptr);

}  // namespace trex::cuda
