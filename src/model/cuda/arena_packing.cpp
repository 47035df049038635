#include "model/cuda/arena_packing.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace trex::dsv4gpu {

namespace {

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void check(const std::vector<ArenaInterval>& requests, int64_t align) {
  TREX_CHECK(align > 0, "arena packing: alignment {} must be positive", align);
  for (size_t i = 0; i < requests.size(); ++i) {
    const ArenaInterval& r = requests[i];
    TREX_CHECK(r.bytes >= 0 && r.begin >= 0 && r.begin <= r.end,
               "arena packing: request {} of {} bytes live over [{}, {}] (expected bytes >= 0, 0 <= begin <= end)",
               i, r.bytes, r.begin, r.end);
  }
}

}  // namespace

ArenaPacking pack_by_lifetime(const std::vector<ArenaInterval>& requests, int64_t align) {
  check(requests, align);
  const size_t n = requests.size();
  std::vector<int64_t> size(n);
  for (size_t i = 0; i < n; ++i) size[i] = round_up(requests[i].bytes, align);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (size[a] != size[b]) return size[a] > size[b];
    return requests[a].begin < requests[b].begin;
  });
  ArenaPacking p;
  p.offset.assign(n, 0);
  std::vector<size_t> placed;
  placed.reserve(n);
  std::vector<std::pair<int64_t, int64_t>> taken;  // [offset, end) of the placed requests live with this one
  for (size_t i : order) {
    if (size[i] == 0) continue;  // takes no byte: offset 0, shares with anything
    taken.clear();
    for (size_t j : placed)
      if (requests[j].overlaps(requests[i])) taken.emplace_back(p.offset[j], p.offset[j] + size[j]);
    std::sort(taken.begin(), taken.end());
    int64_t at = 0;  // the lowest offset whose [at, at + size) no taken range covers
    for (const auto& [b, e] : taken) {
      if (b >= at + size[i]) break;  // the gap below b holds it
      at = std::max(at, e);
    }
    p.offset[i] = at;
    p.bytes = std::max(p.bytes, at + size[i]);
    placed.push_back(i);
  }
  return p;
}

int64_t peak_live_bytes(const std::vector<ArenaInterval>& requests, int64_t align) {
  check(requests, align);
  // +bytes at begin, -bytes after end; at one tick the starts count before the ends that follow it.
  std::vector<std::pair<int64_t, int64_t>> events;
  events.reserve(2 * requests.size());
  for (const ArenaInterval& r : requests) {
    const int64_t s = round_up(r.bytes, align);
    events.emplace_back(r.begin, s);
    if (r.end != kArenaOpen) events.emplace_back(r.end + 1, -s);
  }
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second < b.second;  // a release before a start at one tick
  });
  int64_t live = 0, peak = 0;
  for (const auto& [t, d] : events) live += d, peak = std::max(peak, live);
  return peak;
}

}  // namespace trex::dsv4gpu
