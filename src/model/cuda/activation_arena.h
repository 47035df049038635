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
// of its own, as before the arena) while each region counts what its requests need; the next forward that starts
// with nothing in flight lays the regions out at those sizes in one allocation (the step's own requests, which
// the activation table, activation_plan.h, predicts for the saved activations: a GPU test checks that the arena
// holds at least the table's peak) and binds every pool to its region. A later step that needs more (a layout
// with more compressed entries) falls back for the excess and the plan grows at the next such start. Requests
// placed before a plan keep their memory (the old arena stays alive until they are released).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda/arena_region.h"
#include "model/cuda/gpu_internal.h"

namespace trex::dsv4gpu {

struct ActivationArena {
  std::vector<std::shared_ptr<ArenaRegion>> regions;  // every region, in layout order
  std::vector<std::string> names;                      // the same order: "slot 1 layer 3 keep", "temporaries"
  std::shared_ptr<ArenaRegion> recompute, temporaries;  // the shared ones (read when a pool is made)
  std::shared_ptr<DevMem> memory;                      // the plan's one allocation (null before the first plan)
  int64_t plans = 0;
  int64_t bytes() const { return memory ? int64_t(memory->bytes()) : 0; }
  bool overflowed() const;  // some region placed a request elsewhere since it was laid out
};

// A training model (GpuModelOptions::gradients and activation_arena): every activation pool bound to a region of
// capacity 0 (the first step measures). Called once the blocks and the backend exist.
void activation_arena_bind(GpuModel::Impl& m);
// At the start of a forward with no micro-batch in flight: when a region overflowed since the last plan, releases
// what that forward would release anyway (the last step's streams, saved activations and selections), returns
// the device pool's cached memory, and lays the arena out again in one allocation (each region at its high-water
// mark), every pool rebound. Nothing otherwise (no device call).
void activation_arena_plan(GpuModel::Impl& m);

}  // namespace trex::dsv4gpu
