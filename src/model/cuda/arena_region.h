// One region of the GPU model's activation arena (activation_arena.h): a stack of byte ranges inside a block of
// memory it does not own the layout of. Host bookkeeping only (no device calls): the memory is whatever `base`
// points at, kept alive by `backing`, so the same class serves the device arena and a host test.
//
// push places a request at the top of the stack, 256-byte aligned (as cudaMallocAsync aligns), and returns the
// address, or null when the request ends beyond the capacity: the caller then allocates it elsewhere (Pool in
// gpu_internal.h falls back to a device buffer). The bookkeeping is the same either way, so high_water() is what
// the sequence of requests needs whatever the capacity was: an arena planned with each region's high-water mark
// holds the same sequence again without a single fallback.
//
// release marks an entry dead; dead entries leave the stack once nothing live sits above them. A region serves
// one lifetime pattern (one pool, or pools whose lifetimes nest: one block's recomputed activations at a time, an
// op's temporaries), so it drains to empty and the next step's requests land at the same offsets.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"

namespace trex::dsv4gpu {

class ArenaRegion {
 public:
  static constexpr int64_t kAlign = 256;

  ArenaRegion() = default;  // capacity 0: every request falls back (the first step's, before the plan)
  ArenaRegion(std::shared_ptr<void> backing, char* base, int64_t capacity)
      : backing_(std::move(backing)), base_(base), capacity_(capacity) {
    TREX_CHECK(capacity >= 0 && (capacity == 0 || base), "arena region: capacity {} without memory", capacity);
  }
  ArenaRegion(const ArenaRegion&) = delete;
  ArenaRegion& operator=(const ArenaRegion&) = delete;

  static int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  struct Placed {
    int64_t id = -1;        // the entry, for release
    void* ptr = nullptr;    // null: beyond the capacity (the caller allocates the request elsewhere)
    int64_t offset = 0;     // from the region's base
  };
  Placed push(int64_t bytes) {
    TREX_CHECK(bytes >= 0, "arena region: request of {} bytes", bytes);
    const int64_t off = align_up(top_), end = off + bytes;
    entries_.push_back(Entry{off, end, true});
    top_ = end;
    high_water_ = std::max(high_water_, align_up(end));
    Placed p;
    p.id = int64_t(entries_.size()) - 1;
    p.offset = off;
    if (end <= capacity_) p.ptr = base_ + off;
    else ++overflows_;
    return p;
  }
  void release(int64_t id) {
    TREX_CHECK(id >= 0 && id < int64_t(entries_.size()) && entries_[size_t(id)].live,
               "arena region: release of entry {} that is not live", id);
    entries_[size_t(id)].live = false;
    while (!entries_.empty() && !entries_.back().live) entries_.pop_back();
    top_ = entries_.empty() ? 0 : entries_.back().end;
  }

  int64_t capacity() const { return capacity_; }
  int64_t high_water() const { return high_water_; }  // aligned: the capacity that would have held every request
  int64_t overflows() const { return overflows_; }    // requests placed elsewhere since the region was made
  int64_t in_use() const { return top_; }             // the stack's top (0: empty)
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    int64_t begin = 0, end = 0;
    bool live = false;
  };
  std::shared_ptr<void> backing_;
  char* base_ = nullptr;
  int64_t capacity_ = 0;
  std::vector<Entry> entries_;
  int64_t top_ = 0, high_water_ = 0, overflows_ = 0;
};

}  // namespace trex::dsv4gpu
