// The GPU mesh trainer's entry point in builds without the CUDA backend (the CUDA build compiles
// train/cuda/gpu_mesh_engine_cuda.cpp instead of this file's body).
#include "core/error.h"
#include "train/cuda/gpu_mesh_engine.h"

namespace trex::train {

#ifndef TREX_HAVE_CUDA
TrainResult run_gpu_mesh_training(const TrainConfig& cfg, const std::filesystem::path& config,
                                  const std::filesystem::path&, const RunOptions&) {
  fail("{}: device cuda: this trex was built without the CUDA backend (configure with the CUDA toolkit at "
       "/usr/local/cuda, or train with device cpu)",
       config.string());
}
#endif

}  // namespace trex::train
