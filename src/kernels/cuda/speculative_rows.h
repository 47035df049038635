// Row plumbing of speculative decoding with the MTP module on the GPU (src/infer/cuda_engine_cuda.cpp): the MTP
// step's inputs are rows of the main step's final streams or of a per-slot store of earlier steps' rows, and the
// token after each of them is either known on the host or one of this step's device greedy picks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

// dst[dst_idx[i]] = src_idx[i] >= 0 ? a[src_idx[i]] : b[-src_idx[i] - 1], rows of `width` elements, i < n.
// dst_idx null: row i. Width a multiple of 8 (16-byte vectors).
void copy_rows_bf16(bf16* dst, const int32_t* dst_idx, const bf16* a, const bf16* b, const int32_t* src_idx,
                    int64_t n, int64_t width, cudaStream_t s = nullptr);

// out[i] = code[i] >= 0 ? code[i] : picked[-code[i] - 1] (a host-known token id or a device greedy pick).
void resolve_token_ids(int32_t* out, const int32_t* code, const int32_t* picked, int64_t n, cudaStream_t s = nullptr);

// X [n, hc, d] += e [n, d] broadcast over the hc streams (bf16 storage, fp32 add).
void add_to_streams_bf16(bf16* X, const bf16* e, int64_t n, int64_t hc, int64_t d, cudaStream_t s = nullptr);

}  // namespace trex::cuda
