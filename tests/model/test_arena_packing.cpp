// The activation arena's static plan (model/cuda/arena_packing.h, arena_layout.h) and a packed region's replay
// (arena_region.h): requests live at the same time never share a byte, the layout is never below the most bytes
// live at once, the same trace gives the same layout, requests that never meet share, and a traced step replayed
// in its packed layout places every request without a fallback while a step that differs falls back rather than
// share a live byte. The device side is ActivationArenaGpu's (tests/train/test_activation_arena_gpu.cpp).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"
#include "model/cuda/arena_layout.h"
#include "model/cuda/arena_packing.h"
#include "model/cuda/arena_region.h"

namespace {

using namespace trex;
using dsv4gpu::ArenaInterval;
using dsv4gpu::ArenaRegion;
using dsv4gpu::kArenaOpen;

constexpr int64_t kA = 256;

int64_t up(int64_t n) { return (n + kA - 1) / kA * kA; }

// Every pair of requests that overlaps in time takes disjoint bytes, and every request lies inside the layout.
void expect_valid(const std::vector<ArenaInterval>& r, const dsv4gpu::ArenaPacking& p, const char* what) {
  ASSERT_EQ(p.offset.size(), r.size()) << what;
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(p.offset[i] % kA, 0) << what << ": request " << i;
    EXPECT_LE(p.offset[i] + up(r[i].bytes), p.bytes) << what << ": request " << i;
    for (size_t j = i + 1; j < r.size(); ++j) {
      if (!r[i].overlaps(r[j]) || r[i].bytes == 0 || r[j].bytes == 0) continue;
      const bool apart = p.offset[i] + up(r[i].bytes) <= p.offset[j] || p.offset[j] + up(r[j].bytes) <= p.offset[i];
      EXPECT_TRUE(apart) << what << ": requests " << i << " and " << j << " are live together and share bytes";
    }
  }
}

// A random step: nested and interleaved lifetimes on one clock, some live to the end (open).
std::vector<ArenaInterval> random_trace(uint32_t seed, int n) {
  std::mt19937 g(seed);
  std::vector<ArenaInterval> r;
  std::vector<size_t> live;
  int64_t tick = 0;
  while (int(r.size()) < n || !live.empty()) {
    if (int(r.size()) < n && (live.empty() || g() % 3 != 0)) {
      const int64_t bytes = int64_t(1 + g() % 5000) * (g() % 4 == 0 ? 64 : 1);
      r.push_back({bytes, tick++, kArenaOpen});
      live.push_back(r.size() - 1);
    } else {
      const size_t k = g() % live.size();
      if (int(r.size()) >= n && g() % 7 == 0) {  // still live when the step ends: the whole step
        r[live[k]].begin = 0;
      } else {
        r[live[k]].end = tick++;
      }
      live.erase(live.begin() + std::ptrdiff_t(k));
    }
  }
  return r;
}

TEST(ArenaPacking, RequestsLiveTogetherNeverShareABytesAndTheLayoutHoldsThePeak) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    const std::vector<ArenaInterval> r = random_trace(seed, 120);
    const dsv4gpu::ArenaPacking p = dsv4gpu::pack_by_lifetime(r, kA);
    const std::string what = "seed " + std::to_string(seed);
    expect_valid(r, p, what.c_str());
    const int64_t peak = dsv4gpu::peak_live_bytes(r, kA);
    EXPECT_GE(p.bytes, peak) << what;
    int64_t sum = 0;
    for (const ArenaInterval& x : r) sum += up(x.bytes);
    EXPECT_LE(p.bytes, sum) << what;
    EXPECT_LT(p.bytes, sum) << what << ": requests that never meet should have shared";
  }
}

TEST(ArenaPacking, TheSameTraceGivesTheSameLayout) {
  const std::vector<ArenaInterval> r = random_trace(77, 300);
  const dsv4gpu::ArenaPacking a = dsv4gpu::pack_by_lifetime(r, kA), b = dsv4gpu::pack_by_lifetime(r, kA);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(ArenaPacking, PeakLiveBytesCountsOnlyRequestsAliveAtOneTick) {
  // [0,3] 1000, [1,2] 300, [4,5] 2000 (after both), open 10: peak max(1024+512+256, 2048+256) = 2304.
  const std::vector<ArenaInterval> r = {{1000, 0, 3}, {300, 1, 2}, {2000, 4, 5}, {10, 0, kArenaOpen}};
  EXPECT_EQ(dsv4gpu::peak_live_bytes(r, kA), 2048 + 256);
  const dsv4gpu::ArenaPacking p = dsv4gpu::pack_by_lifetime(r, kA);
  expect_valid(r, p, "four requests");
  EXPECT_EQ(p.bytes, 2048 + 256) << "the 2000-byte request reuses the bytes of the two before it";
  EXPECT_EQ(p.offset[2], 0) << "largest first, at the bottom";
}

TEST(ArenaPacking, RequestsThatNeverMeetShareOneOffsetAndTouchingEndsDoNot) {
  const std::vector<ArenaInterval> seq = {{700, 0, 1}, {900, 2, 3}, {500, 4, 5}};
  const dsv4gpu::ArenaPacking p = dsv4gpu::pack_by_lifetime(seq, kA);
  EXPECT_EQ(p.offset, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(p.bytes, 1024);
  // Sharing one tick is living together.
  const std::vector<ArenaInterval> touch = {{700, 0, 2}, {900, 2, 3}};
  const dsv4gpu::ArenaPacking q = dsv4gpu::pack_by_lifetime(touch, kA);
  expect_valid(touch, q, "touching");
  EXPECT_EQ(q.bytes, 768 + 1024);
  EXPECT_THROW(dsv4gpu::pack_by_lifetime({{10, 5, 4}}, kA), Error) << "an interval that ends before it begins";
  EXPECT_THROW(dsv4gpu::pack_by_lifetime(seq, 0), Error);
}

TEST(ArenaSpace, HoldsDisjointRangesOnly) {
  auto mem = std::make_shared<std::vector<char>>(4096);
  dsv4gpu::ArenaSpace s(std::shared_ptr<void>(mem, mem->data()), mem->data(), 4096);
  EXPECT_TRUE(s.hold(256, 768));
  EXPECT_FALSE(s.hold(512, 1024)) << "overlaps the held [256, 768)";
  EXPECT_FALSE(s.hold(0, 257));
  EXPECT_TRUE(s.hold(0, 256)) << "ends where the held range begins";
  EXPECT_TRUE(s.hold(768, 4096));
  EXPECT_FALSE(s.hold(3840, 4352)) << "beyond the space";
  s.drop(256);
  EXPECT_TRUE(s.hold(512, 768));
  EXPECT_THROW(s.drop(1024), Error);
}

// ---- regions: a traced step, its layout, the same step replayed and a step that differs ----

struct HostStep {
  // Three regions on one clock: two blocks' saved activations (a forward-to-backward lifetime, released in
  // reverse) and a temporaries stack (each op's scratch, plus a row that lives to the step's end).
  std::vector<std::shared_ptr<ArenaRegion>> regions;
  // Host memory per live request: every byte of a placed request is marked with its owner, checked on release.
  std::vector<int> owner;
  char* base = nullptr;
  int64_t fallbacks = 0;
};

// Runs one step on `regs` (placements checked against the others' live bytes); extra > 0 adds a request the
// traced step did not make.
void run_step(std::vector<std::shared_ptr<ArenaRegion>>& regs, std::vector<int>& owner, char* base,
              int64_t extra, int64_t& fallbacks) {
  for (auto& r : regs) r->begin_step();
  regs[0]->clock()->begin_step();
  struct Live {
    int region;
    ArenaRegion::Placed p;
    int64_t bytes;
    int tag;
  };
  std::vector<Live> live;
  int next_tag = 1;
  auto take = [&](int region, int64_t bytes) {
    const ArenaRegion::Placed p = regs[size_t(region)]->push(bytes);
    const int tag = next_tag++;
    if (p.ptr) {
      const int64_t at = static_cast<char*>(p.ptr) - base;
      for (int64_t i = at; i < at + bytes; ++i) {
        EXPECT_EQ(owner[size_t(i)], 0) << "byte " << i << " handed to request " << tag << " while request "
                                        << owner[size_t(i)] << " is live";
        owner[size_t(i)] = tag;
      }
    } else {
      ++fallbacks;
    }
    live.push_back({region, p, bytes, tag});
    return tag;
  };
  auto give = [&](int tag) {
    for (size_t k = 0; k < live.size(); ++k) {
      if (live[k].tag != tag) continue;
      if (live[k].p.ptr) {
        const int64_t at = static_cast<char*>(live[k].p.ptr) - base;
        for (int64_t i = at; i < at + live[k].bytes; ++i) owner[size_t(i)] = 0;
      }
      regs[size_t(live[k].region)]->release(live[k].p.id);
      live.erase(live.begin() + std::ptrdiff_t(k));
      return;
    }
    FAIL() << "request " << tag << " is not live";
  };
  const int row = take(2, 100);  // the step's row: lives past the step's end
  std::vector<int> keep0, keep1;
  for (int i = 0; i < 3; ++i) keep0.push_back(take(0, 4000 + 100 * i));
  { const int t = take(2, 6000); give(t); }
  for (int i = 0; i < 3; ++i) keep1.push_back(take(1, 3000));
  { const int t = take(2, 6000), u = take(2, 200); give(u), give(t); }
  if (extra > 0) take(2, extra);  // left live: a step that differs from the traced one
  // Backward: block 1's scratch, its activations go, then block 0's (larger) scratch reuses their bytes.
  { const int t = take(2, 9000); give(t); }
  for (int t : keep1) give(t);
  { const int t = take(2, 14000); give(t); }
  for (int t : keep0) give(t);
  (void)row;
  // The row and the extra stay live: released at the next step's start, as the model's forward does.
  std::vector<int> left;
  for (const Live& l : live) left.push_back(l.tag);
  for (int t : left) give(t);
}

TEST(ArenaLayout, ATracedStepReplaysInItsPackedLayoutWithoutFallbackAndADifferentOneNeverShares) {
  auto clock = std::make_shared<dsv4gpu::ArenaClock>();
  std::vector<std::shared_ptr<ArenaRegion>> traced;
  for (int i = 0; i < 3; ++i) {
    traced.push_back(std::make_shared<ArenaRegion>());
    traced.back()->use_clock(clock);
  }
  std::vector<int> none;
  int64_t fallbacks = 0;
  // The first step traces (capacity 0: every request falls back). Read the trace before the step's leftover
  // release, as the model plans before its next forward releases them.
  for (auto& r : traced) r->begin_step();
  clock->begin_step();
  {
    // Same sequence as run_step, the leftover row kept live until after the plan.
    auto& R = traced;
    const auto row = R[2]->push(100);
    std::vector<ArenaRegion::Placed> k0, k1;
    for (int i = 0; i < 3; ++i) k0.push_back(R[0]->push(4000 + 100 * i));
    R[2]->release(R[2]->push(6000).id);
    for (int i = 0; i < 3; ++i) k1.push_back(R[1]->push(3000));
    const auto t = R[2]->push(6000), u = R[2]->push(200);
    R[2]->release(u.id), R[2]->release(t.id);
    R[2]->release(R[2]->push(9000).id);
    for (auto it = k1.rbegin(); it != k1.rend(); ++it) R[1]->release(it->id);
    R[2]->release(R[2]->push(14000).id);
    for (auto it = k0.rbegin(); it != k0.rend(); ++it) R[0]->release(it->id);
    const dsv4gpu::ArenaLayout layout = dsv4gpu::plan_arena_layout(traced, true);
    R[2]->release(row.id);
    ASSERT_TRUE(layout.packed);
    // The regions' own peaks: 3 keeps of block 0, 3 of block 1, the temporaries' row + block 0's scratch.
    EXPECT_EQ(layout.sum_of_peaks, (up(4000) + up(4100) + up(4200)) + 3 * up(3000) + up(100) + up(14000));
    EXPECT_EQ(layout.peak_live, up(4000) + up(4100) + up(4200) + 3 * up(3000) + up(100) + up(9000))
        << "block 1's backward scratch with both blocks' activations and the row";
    EXPECT_GE(layout.bytes, layout.peak_live);
    EXPECT_LT(layout.bytes, layout.sum_of_peaks) << "block 0's scratch reuses block 1's released activations";
    // The packed layout's memory, bytes marked by owner.
    auto mem = std::make_shared<std::vector<char>>(size_t(layout.bytes));
    std::vector<int> owner(size_t(layout.bytes), 0);
    std::vector<std::shared_ptr<ArenaRegion>> packed = dsv4gpu::make_arena_regions(
        layout, traced, std::shared_ptr<void>(mem, mem->data()), mem->data(), layout.bytes, clock);
    for (int step = 0; step < 3; ++step) run_step(packed, owner, mem->data(), 0, fallbacks);
    EXPECT_EQ(fallbacks, 0) << "the traced step again: every request at its planned offset";
    for (auto& r : packed) EXPECT_EQ(r->overflows(), 0);
    EXPECT_EQ(clock->last_step_peak, layout.peak_live) << "the measured simultaneous peak of a replayed step";
    // A step with one more request, left live over the backward: it has no planned offset (falls back), and
    // the requests after it move up in their region's order, so their planned ranges meet live bytes: each
    // falls back instead (the owner marks would catch a shared byte).
    run_step(packed, owner, mem->data(), 5000, fallbacks);
    EXPECT_GT(fallbacks, 0);
    EXPECT_GT(packed[2]->overflows(), 0);
  }
  (void)none;
}

}  // namespace
