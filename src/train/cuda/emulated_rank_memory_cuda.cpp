// Where the emulated rank's device memory is (EmulatedRank::memory_report, emulated_rank.h): the stream-ordered
// pool's use split by category, read from what the rank's models and groups hold now, for the message of an
// allocation that failed (`trex bench train --emulate-rank` exits with it).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <regex>

#include "model/cuda/activation_arena.h"
#include "model/cuda/gpu_impl.h"
#include "model/cuda/grad_buckets.h"
#include "train/cuda/emulated_rank.h"

namespace trex::train {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
double g(double b) { return b / kGiB; }
}  // namespace

std::string EmulatedRank::memory_report() const {
  cudaMemPool_t pool;
  int dev = 0;
  uint64_t used = 0, used_high = 0, reserved = 0;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
    (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
    (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high);
    (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  }
  (void)cudaMemGetInfo(&free_b, &total_b);
  (void)cudaGetLastError();
  double weights = 0, grads = 0, optimizer = 0, arena = 0, fallback = 0, buckets = 0;
  // Live activation bytes by kind (the region names without their slot / block: activation_arena.h).
  std::map<std::string, double> live;
  const std::regex strip("^(live|slot [0-9]+) (block [0-9]+ )?");
  for (size_t c = 0; c < models_.size(); ++c) {
    const dsv4gpu::GpuModel::Impl& m = models_[c]->impl();
    weights += double(m.compute.bytes()), grads += double(m.grads.bytes()), optimizer += double(m.master.bytes());
    if (c < opts_.size()) optimizer += double(opts_[c]->state_bytes());
    if (m.arena) {
      arena += double(m.arena->bytes());
      for (size_t i = 0; i < m.arena->regions.size(); ++i) {
        const dsv4gpu::ArenaRegion& r = *m.arena->regions[i];
        if (r.in_use() == 0) continue;
        live[std::regex_replace(m.arena->names[i], strip, "")] += double(r.in_use());
        // A request past the region's capacity was placed in a buffer of its own (the whole step before the plan).
        fallback += double(std::max<int64_t>(0, r.in_use() - r.capacity()));
      }
    }
    if (m.gbuckets)
      for (size_t b = 0; b < m.buckets.size(); ++b)
        if (m.gbuckets->buffer(int(b))) buckets += 4.0 * double(m.buckets[b].end - m.buckets[b].begin);
  }
  const double pipe = double(pipeline_buffer_bytes());
  const double known = weights + grads + optimizer + arena + fallback + buckets + pipe;
  std::string acts;
  for (const auto& [kind, bytes] : live) acts += fmt::format("{}{} {:.2f}", acts.empty() ? "" : ", ", kind, g(bytes));
  return fmt::format(
      "device pool: {:.2f} GiB in use (high-water {:.2f}), {:.2f} reserved; device {:.2f} GiB free of {:.2f}. In use "
      "by category ({} model chunk{}): weights (bf16) {:.2f}, gradients (fp32) {:.2f}, optimizer (fp32 master + AdamW "
      "moments) {:.2f}; activations: the planned arena {:.2f} + {:.2f} in buffers of their own (live by kind: {}); "
      "comm buffers: ZeRO-2 bucket buffers open {:.2f}, pipeline receive buffers {:.2f}, the emulation's loop-back "
      "buffers {:.2f} (outside the pool); workspace and the rest (the ops' temporaries outside the arena, cuBLAS, the "
      "expert exchange's row buffers, ZeRO-3 gathers): {:.2f}",
      g(double(used)), g(double(used_high)), g(double(reserved)), g(double(free_b)), g(double(total_b)),
      models_.size(), models_.size() == 1 ? "" : "s", g(weights), g(grads), g(optimizer), g(arena), g(fallback),
      acts.empty() ? "none" : acts, g(buckets), g(pipe), g(double(loopback_bytes())),
      g(std::max(0.0, double(used) - known)));
}

}  // namespace trex::train
