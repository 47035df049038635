// What `trex train --device cuda` runs (the GPU mesh engine, train/cuda/gpu_mesh_engine.h, one GPU included),
// checked on the config before anything is built, so an unsupported layout is refused with what is missing.
#pragma once
#include <string>

#include "train/config.h"

namespace trex::train {

// A layout as the planner (src/plan) describes it, in plain fields: what `trex train --device cuda` needs to know
// to say whether it runs it.
struct GpuLayoutAsk {
  int64_t tp = 1, pp = 1, vpp = 1, ep = 1, etp = 1, cp = 1, dp = 1;
  bool recompute = false;       // activation recomputation (selective or full): runs (GpuModelOptions::recompute)
  bool optimizer_offload = false;
  bool fully_sharded = false;   // ZeRO-3 / FSDP dense weights
  int zero = 1;                 // the planner's ZeRO level (2: sharded gradients; 3 as fully_sharded)
  bool muon = false;
  bool freeze = false;          // any frozen group (the SFT recipe freezes the router): runs in every layout
  // The MTP module and the sequence-wise balance loss run in every layout (MTP on the last stage, its experts
  // over ep; each stage its own balance terms), so they take no field here.
};
// Empty when `trex train --device cuda` runs this layout today, else every missing piece, "; "-separated: what
// `trex plan` reports beside each layout. check_gpu_mesh_config refuses the same things per config key (a test
// keeps the two in step).
std::string gpu_layout_gaps(const GpuLayoutAsk& a);

// Empty when the config's parallel section (or plain data parallelism over world_size processes when it has none)
// is a layout the GPU mesh engine runs, else the reason, naming the key to change.
std::string check_gpu_mesh_config(const TrainConfig& cfg, int world_size);

}  // namespace trex::train
