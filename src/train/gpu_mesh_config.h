// What `trex train --device cuda` runs on several GPUs (the GPU mesh engine, train/cuda/gpu_mesh_engine.h), checked
// on the config alone before anything is built, so an unsupported layout is refused with what is missing.
#pragma once
#include <string>

#include "train/config.h"

namespace trex::train {

// Empty when the config's parallel section (or plain data parallelism over world_size processes when it has none)
// is a layout the GPU mesh engine runs, else the reason, naming the key to change.
std::string check_gpu_mesh_config(const TrainConfig& cfg, int world_size);

}  // namespace trex::train
