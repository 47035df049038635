// Gated pooling of the KV compressors (design §2.6) on the GPU, mirroring the pooling inside
// trex::dsv4::compressor_forward / _backward: entry e pools, per channel, a softmax over its candidates' logits
// (gate + ape[offset]) of their values: the m tokens of its own window (channels [off, off + c), off = c when
// overlapped, else 0) and, when overlapped and the entry is not its document's first, the previous window's
// tokens (channels [0, c)). The weighted RMSNorm and RoPE that follow are another launch (rmsnorm_rope_fwd
// in elementwise.h). bf16 projections, fp32 ape and softmax math.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

struct CompressArgs {
  int64_t n_entries = 0;                // E
  int64_t ratio = 0;                    // m
  int64_t c = 0;                        // entry width
  bool overlap = false;                 // width of kv / gate rows = (overlap ? 2 : 1) * c
  const int32_t* entry_first = nullptr; // [E] global token index of the window's first token
  const int32_t* entry_doc_index = nullptr;  // [E] window index inside its document
};

// kv, gate [N, width*c] bf16; ape [m, width*c] fp32 -> pooled [E, c] bf16.
void compress_pool_fwd(bf16* pooled, const bf16* kv, const bf16* gate, const float* ape, const CompressArgs& a,
                       cudaStream_t s = nullptr);
// dpooled [E, c] -> dkv, dgate [N, width*c] (bf16; only candidate positions are written: the caller zeroes
// them first), and ACCUMULATES dape [m, width*c] (fp32, deterministic: per-slice sums over the entries added
// in a fixed order). ape_scratch: compress_pool_bwd_scratch_bytes(a) of device memory for the per-slice sums
// (null: allocated and freed stream-ordered here).
void compress_pool_bwd(bf16* dkv, bf16* dgate, float* dape, const bf16* dpooled, const bf16* kv,
                       const bf16* gate, const float* ape, const CompressArgs& a, cudaStream_t s = nullptr,
                       float* ape_scratch = nullptr);
size_t compress_pool_bwd_scratch_bytes(const CompressArgs& a);

}  // namespace trex::cuda
