#include "model/cuda/arena_layout.h"

#include <algorithm>

#include "core/error.h"

namespace trex::dsv4gpu {

std::vector<ArenaInterval> traced_requests(const Regions& regions) {
  std::vector<ArenaInterval> v;
  for (const auto& r : regions)
    for (const ArenaRegion::Traced& t : r->trace())
      v.push_back(t.end < 0 ? ArenaInterval{t.bytes, 0, kArenaOpen} : ArenaInterval{t.bytes, t.begin, t.end});
  return v;
}

ArenaLayout plan_arena_layout(const Regions& regions, bool allow_packed) {
  ArenaLayout l;
  const std::vector<ArenaInterval> requests = traced_requests(regions);
  for (const auto& r : regions) {
    l.stack_cap.push_back(ArenaRegion::align_up(std::max(r->capacity(), r->high_water())));
    l.stacked_bytes += l.stack_cap.back(), l.sum_of_peaks += r->high_water();
  }
  l.peak_live = peak_live_bytes(requests, ArenaRegion::kAlign);
  if (allow_packed) {
    l.packing = pack_by_lifetime(requests, ArenaRegion::kAlign);
    l.packed = l.packing.bytes < l.stacked_bytes;
  }
  l.bytes = l.packed ? l.packing.bytes : l.stacked_bytes;
  return l;
}

Regions make_arena_regions(const ArenaLayout& layout, const Regions& regions, std::shared_ptr<void> backing,
                           char* base, int64_t bytes, const std::shared_ptr<ArenaClock>& clock) {
  TREX_CHECK(bytes >= layout.bytes && (bytes == 0 || base),
             "activation arena: {} bytes of memory for a layout of {}", bytes, layout.bytes);
  TREX_CHECK(layout.stack_cap.size() == regions.size(), "activation arena: a layout of {} regions for {}",
             layout.stack_cap.size(), regions.size());
  Regions out;
  if (layout.packed) {
    auto space = std::make_shared<ArenaSpace>(backing, base, bytes);
    size_t next = 0;
    for (const auto& r : regions) {
      std::vector<ArenaRegion::Slot> table;
      for (const ArenaRegion::Traced& t : r->trace()) {
        TREX_CHECK(next < layout.packing.offset.size(), "activation arena: the regions traced more requests "
                   "than the layout planned ({})", layout.packing.offset.size());
        table.push_back({layout.packing.offset[next++], t.bytes});
      }
      out.push_back(std::make_shared<ArenaRegion>(space, std::move(table)));
    }
    TREX_CHECK(next == layout.packing.offset.size(), "activation arena: the layout planned {} requests, the "
               "regions traced {}", layout.packing.offset.size(), next);
  } else {
    int64_t off = 0;
    for (size_t i = 0; i < regions.size(); ++i) {
      out.push_back(std::make_shared<ArenaRegion>(backing, layout.stack_cap[i] ? base + off : nullptr,
                                                  layout.stack_cap[i]));
      off += layout.stack_cap[i];
    }
  }
  for (auto& r : out) r->use_clock(clock);
  return out;
}

}  // namespace trex::dsv4gpu
