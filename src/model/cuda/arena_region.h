// One region of the GPU model's activation arena (activation_arena.h): the requests of one pool (or of pools whose
// lifetimes nest) inside a block of memory it does not own the layout of. Host bookkeeping only (no device calls):
// the memory is whatever the region is given, kept alive by a shared pointer, so the same class serves the
// device arena and a host test.
//
// Every region keeps a stack of its live requests, 256-byte aligned (as cudaMallocAsync aligns): release marks an
// entry dead and dead entries leave the stack once nothing live sits above them. Its high_water() is what the
// requests need as one stack, whatever the region's memory was. Where a request goes:
//  - a stacked region (a base and a capacity): at the stack's top, or elsewhere (null) when it would end beyond
//    the capacity; a region laid out at its high-water mark holds the same sequence again without a fallback;
//  - a packed region (an ArenaSpace and a table from a static plan, arena_packing.h): the step's k-th request at
//    the table's k-th offset, when it fits the planned size and no live request of any region of that space holds
//    one of its bytes (checked: a step that differs from the traced one falls back instead of sharing bytes);
//  - a region of neither (capacity 0, the first step's): elsewhere (null). The caller then allocates the request
//    itself (Pool in gpu_internal.h falls back to a device buffer) and overflows() counts it.
// The trace: each request of the step (begin_step starts one) with its aligned size and the ticks of its request
// and release on the ArenaClock the arena's regions share, which orders every request and release of a step.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/error.h"

namespace trex::dsv4gpu {

// Shared by every region of one arena (across its plans): the step's clock and the bytes live in all regions.
struct ArenaClock {
  int64_t tick = 0;
  int64_t live = 0;            // aligned bytes of every live request
  int64_t step_peak = 0;       // the most live at once since the step began
  int64_t last_step_peak = 0;  // the same over the last complete step
  void begin_step() { last_step_peak = step_peak, step_peak = live, tick = 0; }
};

// The memory of one packed plan, and the byte ranges of it that live requests hold.
class ArenaSpace {
 public:
  ArenaSpace(std::shared_ptr<void> backing, char* base, int64_t bytes)
      : backing_(std::move(backing)), base_(base), bytes_(bytes) {
    TREX_CHECK(bytes >= 0 && (bytes == 0 || base), "arena space: {} bytes without memory", bytes);
  }
  char* base() const { return base_; }
  int64_t bytes() const { return bytes_; }
  // [begin, end) for one request: false (nothing held) when it leaves the space or a live request holds a byte.
  bool hold(int64_t begin, int64_t end) {
    if (begin < 0 || end > bytes_ || begin >= end) return false;
    auto next = held_.lower_bound(begin);
    if (next != held_.end() && next->first < end) return false;
    if (next != held_.begin() && std::prev(next)->second > begin) return false;
    held_.emplace(begin, end);
    return true;
  }
  void drop(int64_t begin) {
    TREX_CHECK(held_.erase(begin) == 1, "arena space: no live request at offset {}", begin);
  }
  int64_t held() const { return int64_t(held_.size()); }

 private:
  std::shared_ptr<void> backing_;
  char* base_ = nullptr;
  int64_t bytes_ = 0;
  std::map<int64_t, int64_t> held_;  // begin -> end
};

class ArenaRegion {
 public:
  static constexpr int64_t kAlign = 256;
  static int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  struct Slot {
    int64_t offset = 0, bytes = 0;  // in the space; bytes aligned
  };
  struct Traced {
    int64_t bytes = 0;               // aligned
    int64_t begin = 0, end = -1;     // ticks of the request and its release (-1: live when the trace was read)
    int64_t stack_offset = 0;        // where the region's stack put it
  };
  struct Placed {
    int64_t id = -1;        // the entry, for release
    void* ptr = nullptr;    // null: the caller allocates the request elsewhere
    int64_t offset = 0;     // from the memory's base (a stacked region's or the space's)
  };

  ArenaRegion() : clock_(std::make_shared<ArenaClock>()) {}  // capacity 0: every request falls back
  ArenaRegion(std::shared_ptr<void> backing, char* base, int64_t capacity)
      : backing_(std::move(backing)), base_(base), capacity_(capacity), clock_(std::make_shared<ArenaClock>()) {
    TREX_CHECK(capacity >= 0 && (capacity == 0 || base), "arena region: capacity {} without memory", capacity);
  }
  ArenaRegion(std::shared_ptr<ArenaSpace> space, std::vector<Slot> table)
      : space_(std::move(space)), table_(std::move(table)), clock_(std::make_shared<ArenaClock>()) {
    TREX_CHECK(space_, "arena region: a packed region without its space");
    for (size_t k = 0; k < table_.size(); ++k)
      TREX_CHECK(table_[k].offset >= 0 && table_[k].offset % kAlign == 0 && table_[k].bytes >= 0 &&
                     table_[k].offset + table_[k].bytes <= space_->bytes(),
                 "arena region: request {} planned at [{}, +{}) outside the space of {} bytes", k,
                 table_[k].offset, table_[k].bytes, space_->bytes());
  }
  ArenaRegion(const ArenaRegion&) = delete;
  ArenaRegion& operator=(const ArenaRegion&) = delete;

  // The clock shared with the arena's other regions (before the region's first request).
  void use_clock(std::shared_ptr<ArenaClock> clock) {
    TREX_CHECK(clock && entries_.empty(), "arena region: a clock for a region with live requests");
    clock_ = std::move(clock);
  }
  // A new step: its requests count from 0 (a packed region's table index) and the trace starts empty.
  void begin_step() { ++gen_, trace_.clear(); }

  Placed push(int64_t bytes) {
    TREX_CHECK(bytes >= 0, "arena region: request of {} bytes", bytes);
    const int64_t off = align_up(top_), end = off + bytes, size = align_up(bytes);
    Entry e;
    e.begin = off, e.end = end, e.size = size, e.gen = gen_, e.trace = int64_t(trace_.size());
    trace_.push_back(Traced{size, clock_->tick++, -1, off});
    clock_->live += size, clock_->step_peak = std::max(clock_->step_peak, clock_->live);
    top_ = end;
    high_water_ = std::max(high_water_, align_up(end));
    Placed p;
    p.offset = off;
    if (space_) {
      const size_t k = size_t(e.trace);
      if (k < table_.size() && size <= table_[k].bytes &&
          (size == 0 || space_->hold(table_[k].offset, table_[k].offset + size))) {
        p.ptr = space_->base() + table_[k].offset, p.offset = table_[k].offset;
        if (size > 0) e.held = table_[k].offset;
      }
    } else if (end <= capacity_) {
      p.ptr = base_ + off;
    }
    if (!p.ptr) ++overflows_;
    entries_.push_back(e);
    p.id = int64_t(entries_.size()) - 1;
    return p;
  }
  void release(int64_t id) {
    TREX_CHECK(id >= 0 && id < int64_t(entries_.size()) && entries_[size_t(id)].live,
               "arena region: release of entry {} that is not live", id);
    Entry& e = entries_[size_t(id)];
    e.live = false;
    clock_->live -= e.size;
    const int64_t t = clock_->tick++;
    if (e.gen == gen_) trace_[size_t(e.trace)].end = t;
    if (e.held >= 0) space_->drop(e.held), e.held = -1;
    while (!entries_.empty() && !entries_.back().live) entries_.pop_back();
    top_ = entries_.empty() ? 0 : entries_.back().end;
  }

  int64_t capacity() const { return capacity_; }      // a stacked region's (0 when packed)
  bool packed() const { return bool(space_); }
  int64_t high_water() const { return high_water_; }  // aligned: the stack that would have held every request
  int64_t overflows() const { return overflows_; }    // requests placed elsewhere since the region was made
  int64_t in_use() const { return top_; }             // the stack's top (0: empty)
  bool empty() const { return entries_.empty(); }
  const std::vector<Traced>& trace() const { return trace_; }  // this step's requests, in order
  const std::shared_ptr<ArenaClock>& clock() const { return clock_; }

 private:
  struct Entry {
    int64_t begin = 0, end = 0, size = 0;  // on the stack; size aligned
    int64_t gen = 0, trace = 0;            // the step it was requested in, its index in that step's trace
    int64_t held = -1;                     // a packed region's offset in the space (-1: none)
    bool live = true;
  };
  std::shared_ptr<void> backing_;
  char* base_ = nullptr;
  int64_t capacity_ = 0;
  std::shared_ptr<ArenaSpace> space_;
  std::vector<Slot> table_;
  std::shared_ptr<ArenaClock> clock_;
  std::vector<Entry> entries_;
  std::vector<Traced> trace_;
  int64_t gen_ = 0;
  int64_t top_ = 0, high_water_ = 0, overflows_ = 0;
};

}  // namespace trex::dsv4gpu
