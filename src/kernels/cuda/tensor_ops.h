// Small memory-bound helpers of the GPU training step (launchers; raw pointers, plain ints): precision casts,
// fp32 accumulation, the [N, G, X] <-> [G, N, X] permutation of the grouped output projection, and the token
// embedding into n_hc streams with its backward.
#pragma once
#include <vector>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

void cast_f32_to_bf16(bf16* y, const float* x, int64_t n, cudaStream_t s = nullptr);
void cast_bf16_to_f32(float* y, const bf16* x, int64_t n, cudaStream_t s = nullptr);
// y[i] += x[i] (one fp32 add per element: exact order, deterministic)
void add_f32(float* y, const float* x, int64_t n, cudaStream_t s = nullptr);
// y[i] += x[i]
void add_bf16_to_f32(float* y, const bf16* x, int64_t n, cudaStream_t s = nullptr);
// y[i] *= a
void scale_f32(float* y, float a, int64_t n, cudaStream_t s = nullptr);
// Sum of x[i]^2 in fp64 (the global gradient norm for clipping): a fixed grid of kSumSquaresBlocks blocks writes
// fp64 partials to scratch[1 ..], one block adds them in a fixed order into scratch[0] (deterministic). scratch
// holds kSumSquaresBlocks + 1 doubles. Stream-ordered; the caller reads scratch[0].
constexpr int kSumSquaresBlocks = 1024;
void sum_squares_f32(const float* x, int64_t n, double* scratch, cudaStream_t s = nullptr);

// to_group_major: out [G, N, X] from in [N, G, X]; otherwise the inverse.
void permute_groups(bf16* out, const bf16* in, int64_t N, int64_t G, int64_t X, bool to_group_major,
                    cudaStream_t s = nullptr);

// X [N, n_hc, d] (written): every stream = table[ids[t]] (ids checked on the host by the caller).
void embed_streams_fwd(bf16* X, const int32_t* ids, const bf16* table, int64_t N, int64_t d, int64_t n_hc,
                       cudaStream_t s = nullptr);
// dtable [V, d] += sum over streams of dX [N, n_hc, d], deterministic: `order` [N] lists the tokens grouped by id
// (ascending position within a group), `seg` [n_seg + 1] each group's first index in `order`; one block sums a
// group's rows in that order and adds the sum to the table row (one writer per row, no atomics), so the same batch
// gives the same gradient bit for bit. embed_bwd_plan builds order / seg on the host.
void embed_streams_bwd(float* dtable, const int32_t* ids, const int32_t* order, const int32_t* seg, int64_t n_seg,
                       const float* dX, int64_t d, int64_t n_hc, cudaStream_t s = nullptr);
void embed_bwd_plan(const int32_t* ids, int64_t N, std::vector<int32_t>* order, std::vector<int32_t>* seg);

}  // namespace trex::cuda
