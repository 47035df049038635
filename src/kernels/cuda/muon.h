// Muon on the GPU for a batch of equally shaped matrices, mirroring trex::optim::muon_update (src/optim/
// update_rules.h, design §5): momentum M <- mu M + G; input = Nesterov ? mu M + G : M; X0 = input / (||input||_F +
// 1e-7); hybrid Newton-Schulz X <- a X + (b A + c A A) X with A = X X^T, (a, b, c) = (3.4445, -4.7750, 2.0315) for
// the fast steps and (2, -1.5, 0.5) for the final ones, worked on the short side (A is min(rows, cols) square);
// W <- W (1 - lr wd) - lr sqrt(max(rows, cols)) update_rms X.
//
// The matrices sit anywhere in the parameter arena (one offset each, the same into w, g, momentum and the bf16
// copy): the momentum kernel gathers them into a contiguous fp32 batch, the Newton-Schulz products are strided-
// batched bf16 cuBLASLt GEMMs with fp32 accumulation, and X itself is kept in fp32 (the a X + B X update
// accumulates into it through the GEMM's beta; its bf16 image feeds the next products). Norms are per matrix, in
// double from fixed-order partial sums (deterministic).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"

namespace trex::cuda {

struct MuonStep {
  double lr = 0.02;  // the Muon learning rate (already times muon_lr_scale)
  double momentum = 0.95;
  bool nesterov = true;
  int ns_fast_steps = 8, ns_final_steps = 2;
  double update_rms = 0.18, weight_decay = 0.1;
  bool zero_grad = false;  // leave g = 0 behind (the next backward accumulates into zeroed gradients)
  float grad_scale = 1.f;  // the gradient used is g * grad_scale (as AdamWStep::grad_scale)
};

// Scratch of one batch: X fp32 and bf16 [batch, rows, cols], A and B bf16 [batch, s, s] (s = min(rows, cols)),
// per-block partial sums of squares. Grows on demand, never shrinks.
class MuonScratch {
 public:
  void reserve(int64_t batch, int64_t rows, int64_t cols);
  float* x32() const { return x32_.as<float>(); }
  __nv_bfloat16* x16() const { return x16_.as<__nv_bfloat16>(); }
  __nv_bfloat16* a16() const { return a16_.as<__nv_bfloat16>(); }
  __nv_bfloat16* b16() const { return b16_.as<__nv_bfloat16>(); }
  double* partial() const { return partial_.as<double>(); }

 private:
  DeviceBuffer x32_, x16_, a16_, b16_, partial_;
};

// Elements of one matrix per block in the elementwise kernels (the partial sums are per block of this size).
constexpr int64_t kMuonChunk = 16384;

// In place on the batch: X (x32 fp32, with x16 = bf16(x32) on entry) <- NS(X) for `batch` rows x cols matrices
// (contiguous). X is expected normalised (Frobenius norm <= 1); a16 / b16 are scratch. x16 is stale afterwards.
void newton_schulz_batched(Gemm& gemm, float* x32, __nv_bfloat16* x16, __nv_bfloat16* a16, __nv_bfloat16* b16,
                           int64_t batch, int64_t rows, int64_t cols, int fast_steps, int final_steps,
                           cudaStream_t s = nullptr);

// Frobenius normalisation of each matrix of the batch: x32 <- x32 / (||x32||_F + 1e-7), x16 = bf16(x32).
// partial is scratch of batch * ceil(rows * cols / kMuonChunk) doubles.
void muon_normalise(float* x32, __nv_bfloat16* x16, double* partial, int64_t batch, int64_t rows, int64_t cols,
                    cudaStream_t s = nullptr);

// One Muon step on `batch` rows x cols matrices at element offsets d_offsets[batch] (device) into w, g, momentum
// (fp32) and w_bf16 (nullable: refreshed from the new w). Scratch sized by scratch.reserve(batch, rows, cols).
void muon_step_batched(Gemm& gemm, MuonScratch& scratch, const int64_t* d_offsets, int64_t batch, int64_t rows,
                       int64_t cols, float* w, float* g, float* momentum, __nv_bfloat16* w_bf16, const MuonStep& p,
                       cudaStream_t s = nullptr);

// The same step in three parts for a ZeRO-1 shard (each data-parallel rank holds a flat slice of the fp32 master
// and momentum, so a matrix may be cut between ranks), with the same arithmetic as muon_step_batched:
//   1. muon_momentum_range on this rank's elements of the Muon matrices (contiguous runs): momentum <- mu momentum +
//      g grad_scale; g <- the Newton-Schulz input (Nesterov or not), in place;
//   2. (the caller all-gathers the inputs of the matrices cut between ranks, then)
//      muon_orthogonalise_batched: scratch.x32() <- NS(input / ||input||_F) of whole matrices at d_offsets into u;
//   3. muon_apply_ranges: W <- W (1 - lr wd) - lr sqrt(max(rows, cols)) update_rms X on the elements [lo, hi) of
//      each matrix that this rank holds: w_shard[shard_off + (i - lo)], w_bf16[offset + i] (nullable).
void muon_momentum_range(float* g, float* momentum, int64_t n, const MuonStep& p, cudaStream_t s = nullptr);
void muon_orthogonalise_batched(Gemm& gemm, MuonScratch& scratch, const int64_t* d_offsets, int64_t batch,
                                int64_t rows, int64_t cols, const float* u, const MuonStep& p,
                                cudaStream_t s = nullptr);
// d_ranges: int64 [batch, 3] on the device: lo, hi (element range within the matrix) and shard_off per matrix.
void muon_apply_ranges(const MuonScratch& scratch, const int64_t* d_offsets, const int64_t* d_ranges, int64_t batch,
                       int64_t rows, int64_t cols, float* w_shard, __nv_bfloat16* w_bf16, const MuonStep& p,
                       cudaStream_t s = nullptr);

}  // namespace trex::cuda
