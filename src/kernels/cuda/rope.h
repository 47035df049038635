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

// RoPE fused with the [N, G, X] <-> [G, N, X] permutation of the grouped output projection (X = heads / G * c,
// N = a.rows): to_group_major: out [G, N, X] = permute(rope(in)) with in [N, heads, c] left unchanged; otherwise
// out [N, heads, c] = rope(permute^-1(in)). One pass instead of a copy, an in-place rope_apply and
// permute_groups, with that sequence's math (the fp32 rotation of the bf16 values, rounded once).
void rope_permute_groups(bf16* out, const bf16* in, int64_t G, const RopeArgs& a, bool to_group_major,
                         cudaStream_t s = nullptr);

}  // namespace trex::cuda
