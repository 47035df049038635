// AdamW on the GPU over one flat fp32 arena (every parameter of the model in one launch: multi-tensor by
// construction), mirroring trex::optim::adamw_update (decoupled decay w <- w (1 - lr wd), bias-corrected moments),
// and refreshing the bf16 compute copy of the weights in the same pass (and, on request, zeroing the gradient it
// just read: the trainer's next backward accumulates into zeroed gradients, and a write folded into this pass
// replaces a separate memset pass over the gradient arena).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

struct AdamWStep {
  double lr = 1e-5, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  int64_t step = 1;  // 1-based, for the bias corrections
  bool zero_grad = false;  // g = 0 afterwards
  // The gradient used is g * grad_scale, one fp32 multiply (bit-identical to scaling g in a pass of its own first):
  // gradient clipping and accumulation's 1 / micro-batches folded into this pass instead of a read-write pass over g.
  float grad_scale = 1.f;
};

// w, m, v [n] fp32 updated; g [n] fp32 read (and zeroed with a.zero_grad); w_bf16 [n] (nullable) = bf16(w)
// afterwards.
void adamw_step(float* w, float* g, float* m, float* v, __nv_bfloat16* w_bf16, int64_t n, const AdamWStep& a,
                cudaStream_t s = nullptr);

}  // namespace trex::cuda
