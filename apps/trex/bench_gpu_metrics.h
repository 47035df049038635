// What `trex bench train` prints about the GPU model beyond throughput (the single-GPU, data-parallel and
// emulated-rank paths share it): the activation arena's layout (activation_arena.h) and ZeRO-3's weight gathers
// (weight_gather.h). Included under TREX_HAVE_CUDA only.
#pragma once
#include <cmath>

#include <nlohmann/json.hpp>

#include "model/cuda/gpu_model.h"

namespace trex::bench {

// The arena's size, what the regions would take one after another (their own peaks summed), and the most bytes
// live at once in the last step (no layout holds it in less), GiB; null without the arena.
inline nlohmann::json arena_json(const dsv4gpu::GpuModel& m) {
  const dsv4gpu::GpuModel::ArenaInfo a = m.activation_arena();
  if (a.plans == 0) return nullptr;
  auto gib = [](int64_t b) { return std::round(double(b) / double(1ull << 30) * 100) / 100; };
  return {{"layout", a.packed ? "packed by lifetime" : "stacked"},
          {"arena_gib", gib(a.bytes)},
          {"sum_of_region_peaks_gib", gib(a.sum_of_peaks)},
          {"simultaneous_peak_gib", gib(a.peak_live)},
          {"plans", a.plans}};
}

// ZeRO-3's gathers over the timed steps (`before`: the times when they began), ms per step; null without ZeRO-3.
inline nlohmann::json gather_json(const dsv4gpu::GpuModel::GatherTimes& before,
                                  const dsv4gpu::GpuModel::GatherTimes& after, int64_t steps) {
  if (after.gathers == 0) return nullptr;
  auto per_step = [steps](double ms) { return std::round(ms / double(steps) * 100) / 100; };
  const double total = after.total_ms - before.total_ms, exposed = after.exposed_ms - before.exposed_ms;
  return {{"gather_ms_per_step", per_step(total)},
          {"exposed_ms_per_step", per_step(exposed)},  // the compute stream waited (part of exposed_comm_ms)
          {"hidden_fraction", total > 0 ? std::round((1 - exposed / total) * 1e4) / 1e4 : 0.0},
          {"gathers_per_step", (after.gathers - before.gathers) / steps}};
}

}  // namespace trex::bench
