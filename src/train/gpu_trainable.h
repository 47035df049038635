// DeepSeek-V4 training on one GPU behind the Trainable interface (`trex train` with `device: cuda`): the GPU model
// (model/cuda/gpu_model.h) starts from the host model's initialised weights (design §5 init, or init_from /
// init_from_run), router biases and hash tables, then keeps everything on the device: bf16 forward and backward
// with fp32 accumulation, fp32 master weights, gradients and optimiser state (AdamW or Muon with the CPU's
// definitions), clipping by the global norm, the sequence-wise balance loss, the auxiliary-loss-free router-bias update from
// the step's expert loads. Its updater writes the native checkpoint format by name (model, optimiser moments, state), so a run can
// resume on the other device and `trex export-hf` reads it.
// Not on the GPU (refused with the config key to change): the MTP module (model.use_mtp: false), frozen parameters
// (freeze), several processes.
#pragma once
#include <memory>

#include "train/dsv4_trainable.h"

namespace trex::train {

// True in builds with the CUDA backend.
bool gpu_training_built();

// Moves the host model's values to a new GPU model (the host model can be dropped afterwards). Throws in builds
// without CUDA.
std::unique_ptr<Trainable> make_gpu_dsv4_trainable(Dsv4Trainable& host, const Dsv4TrainOptions& opts,
                                                   const std::string& where);

}  // namespace trex::train
