// The GPU model's activation arena: every activation a training step holds, in one device allocation carved into
// regions, so that a step after the plan makes no device allocation (llm.c style: the memory is laid out once).
//
// Regions (arena_region.h, each a stack with one lifetime pattern):
//  - per micro-batch slot (the live batch state, and each pipeline slot of GpuModelOptions::stage_slots: the
//    micro-batches in flight): the streams and heads (Impl::acts), the stage output (out), the input gradient
//    kept for the boundary send (grad_out), and per block its saved activations (keep; with full recomputation
//    they are in the shared region below) and its router / indexer selections (picks);
//  - shared by the slots: recompute, one block's activations at a time (selective: the dropped ones, GpuBlock::
//    redo; full: the replayed block's whole keep), and temporaries, the stack of the ops' scratch (Ctx::scratch),
//    the backward's gradient streams and one block's backward temporaries, the head's CE sums and the balance
//    rows (their lifetimes nest).
// Plan: the first step runs with every region empty (capacity 0: each request is a stream-ordered device buffer
// of its own, as before the arena) while each region traces its requests: their sizes and, on a clock the regions
// share, the ticks of each request and release. The next forward that starts with nothing in flight lays the arena
// out in one allocation from that trace (arena_packing.h): requests never live at the same time share bytes, so
// the arena approaches the step's simultaneous peak (a block's saved activations, released in the backward, give
// their bytes to the lower blocks' recomputation and backward temporaries) instead of the sum of the regions'
// peaks; each region then puts its k-th request of a step at the k-th planned offset. The same allocation first
// waits for the device and trims the device pool, so that the first step's freed buffers do not stay cached
// beside the arena. A step that differs from the traced one (a request larger than planned, more requests, or a
// planned range still held by a live request: checked, never shared) falls back for those requests and the arena
// is laid out again at the next such start; after kPackedPlans packed layouts it is stacked instead (each region
// a slice of its own high-water mark, which holds any order of requests within the marks). The activation table
// (activation_plan.h) predicts the saved activations: a GPU test checks that the step's simultaneous peak holds
// at least the table's kept bytes. Requests placed before a plan keep their memory (the old arena stays alive
// until they are released).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda/arena_region.h"
#include "model/cuda/gpu_internal.h"

namespace trex::dsv4gpu {

// Packed layouts tried before the arena is stacked (activation_arena_plan).
constexpr int64_t kPackedPlans = 2;

struct ActivationArena {
  std::vector<std::shared_ptr<ArenaRegion>> regions;  // every region, in layout order
  std::vector<std::string> names;                      // the same order: "slot 1 layer 3 keep", "temporaries"
  std::shared_ptr<ArenaRegion> recompute, temporaries;  // the shared ones (read when a pool is made)
  std::shared_ptr<DevMem> memory;                      // the plan's one allocation (null before the first plan)
  std::shared_ptr<ArenaClock> clock = std::make_shared<ArenaClock>();  // shared by every region
  int64_t plans = 0, packed_plans = 0;
  bool packed = false;  // the current layout: packed by lifetime, or stacked
  // At the last plan: the sum of the regions' high-water marks (what one region after another would take) and the
  // most bytes the traced step's requests held at once (no layout of them is smaller).
  int64_t planned_sum_of_peaks = 0, planned_peak_live = 0;
  int64_t sum_of_peaks() const;  // the regions' high-water marks now, at least the planned sum
  int64_t bytes() const { return memory ? int64_t(memory->bytes()) : 0; }
  bool overflowed() const;  // some region placed a request elsewhere since it was laid out
};

// A training model (GpuModelOptions::gradients and activation_arena): every activation pool bound to a region of
// capacity 0 (the first step measures). Called once the blocks and the backend exist.
void activation_arena_bind(GpuModel::Impl& m);
// At the start of a forward with no micro-batch in flight (a step's start): when a region overflowed since the
// last plan, releases what that forward would release anyway (the last step's streams, saved activations and
// selections), returns the device pool's cached memory, and lays the arena out again in one allocation from the
// step just traced, every pool rebound. Then every region's trace starts again (no device call).
void activation_arena_plan(GpuModel::Impl& m);

}  // namespace trex::dsv4gpu
