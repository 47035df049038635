// The GPU trainer's entry points in builds without the CUDA backend (the CUDA build compiles
// train/cuda/gpu_trainable_cuda.cpp instead of this file's body).
#include "core/error.h"
#include "train/gpu_trainable.h"

namespace trex::train {

#ifndef TREX_HAVE_CUDA
bool gpu_training_built() { return false; }

std::unique_ptr<Trainable> make_gpu_dsv4_trainable(Dsv4Trainable&, const Dsv4TrainOptions&,
                                                   const std::string& where) {
  fail("{}: device cuda: this trex was built without the CUDA backend (configure with the CUDA toolkit at "
       "/usr/local/cuda, or train with device cpu)",
       where);
}
#endif

}  // namespace trex::train
