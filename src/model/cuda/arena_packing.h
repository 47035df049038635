// Static memory planning for the activation arena (activation_arena.h): every request of one training step, with
// its size and its live interval on the step's clock (ticks: one per request and per release, in program order),
// gets a byte offset such that two requests whose intervals overlap never share a byte; requests that are never
// live together may. The arena's size then approaches the step's simultaneous peak (the most bytes live at one
// tick) instead of the sum of every region's own peak. Host only, no device call: CPU-tested.
//
// The placement is greedy first-fit by decreasing size (the static planners of llm.c-style trainers and TVM's
// storage rewrite do the same): each request, largest first, goes to the lowest offset that no already placed,
// time-overlapping request covers. Ties break on the interval's start and then the input order, so the same
// trace always gives the same layout.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

namespace trex::dsv4gpu {

// A request of `bytes` live over the ticks [begin, end] (both included). A request still live when the traced
// step ended is live for the whole step: begin 0, end kArenaOpen (it is released in the next step, at a tick
// that trace does not know).
constexpr int64_t kArenaOpen = std::numeric_limits<int64_t>::max();

struct ArenaInterval {
  int64_t bytes = 0;
  int64_t begin = 0, end = 0;
  bool overlaps(const ArenaInterval& o) const { return begin <= o.end && o.begin <= end; }
};

struct ArenaPacking {
  std::vector<int64_t> offset;  // per request, in the input's order, a multiple of the alignment
  int64_t bytes = 0;            // the layout's size: max over requests of offset + aligned bytes
};

// `align` > 0: every offset is a multiple of it and every request takes its size rounded up to it.
ArenaPacking pack_by_lifetime(const std::vector<ArenaInterval>& requests, int64_t align);

// The most aligned bytes live at one tick: no layout of these requests is smaller.
int64_t peak_live_bytes(const std::vector<ArenaInterval>& requests, int64_t align);

}  // namespace trex::dsv4gpu
