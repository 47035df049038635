// Partial interleaved RoPE on the GPU (design §2.4.4), mirroring trex::dsv4::rope_rotate: in each head vector
// of width c the last rope_dim dims form pairs (x[2k], x[2k+1]) rotated by sign * angle(pos, k). cos/sin come
// from the host's RopeTable (fp32 [n_pos, rope_dim/2]) so both paths use the same angles. The transpose of a
// rotation by +angle is the rotation by -angle: backward passes -sign.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

struct RopeArgs {
  int64_t rows = 0;      // tokens (or compressed entries)
  int64_t heads = 1;     // head vectors per row
  int64_t c = 0;         // head width; the rotated dims are [c - rope_dim, c)
  int64_t rope_dim = 0;  // even
  const int32_t* pos = nullptr;  // [rows] position of each row
  const float* cos = nullptr;    // [n_pos, rope_dim/2]
  const float* sin = nullptr;
  int sign = 1;
};

// x [rows, heads, c], in place.
void rope_apply(bf16* x, const RopeArgs& a, cudaStream_t s = nullptr);
void rope_apply(float* x, const RopeArgs& a, cudaStream_t s = nullptr);

}  // namespace trex::cuda
