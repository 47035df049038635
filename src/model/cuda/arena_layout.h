// The activation arena's layout from one traced step (activation_arena.h): the regions' traces (arena_region.h)
// as lifetime intervals, their packing (arena_packing.h) or the stacked alternative, and the regions of the new
// layout in a given block of memory. Host only (the device allocation is the caller's): CPU-tested.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/cuda/arena_packing.h"
#include "model/cuda/arena_region.h"

namespace trex::dsv4gpu {

using Regions = std::vector<std::shared_ptr<ArenaRegion>>;

struct ArenaLayout {
  bool packed = false;
  int64_t bytes = 0;                 // the memory the layout needs
  ArenaPacking packing;              // every traced request's offset, regions in order, each in its trace order
  std::vector<int64_t> stack_cap;    // per region: its high-water mark (or capacity), aligned
  int64_t stacked_bytes = 0;         // the sum of stack_cap: the stacked layout's size
  int64_t sum_of_peaks = 0;          // the sum of the regions' high-water marks
  int64_t peak_live = 0;             // the most bytes the traced requests hold at once (packing's lower bound)
};

// The traced step's requests of every region, in region order, as intervals: one still live when the trace is
// read is live over the whole step (it is released in the next step, at a tick this trace does not know, while
// that step's requests start from tick 0).
std::vector<ArenaInterval> traced_requests(const Regions& regions);

// Packed when allow_packed and packing takes fewer bytes than the stacked layout; stacked otherwise.
ArenaLayout plan_arena_layout(const Regions& regions, bool allow_packed);

// The layout's regions (in the order of `regions`, whose traces it was planned from) over `bytes` of memory at
// `base` (>= layout.bytes; kept alive by backing), each on `clock`.
Regions make_arena_regions(const ArenaLayout& layout, const Regions& regions, std::shared_ptr<void> backing,
                           char* base, int64_t bytes, const std::shared_ptr<ArenaClock>& clock);

}  // namespace trex::dsv4gpu
